"""One offline vLLM engine: greedy tokens for a list of token-id prompts.

Usage: python run_llm.py SPEC_JSON OUT_JSON, SPEC = {"model", "prompts",
"max_tokens", "kv" (a kv_transfer_config or null), "wait_keys" (optional)}.
Writes the generated token ids, one list per prompt, to OUT_JSON. Run in a
process of its own: vLLM spawns its workers, hence the __main__ guard.

wait_keys {"url", "count", "timeout"}: before exiting, wait until the store
master's /get_all_keys at url lists at least count keys; count "full_blocks":
as many as the prompts have full blocks at the engine's block size (a GPU's
vLLM gives sliding-window layers a block size of their own). vLLM's
MooncakeStoreConnector saves blocks from a daemon thread after a request
finishes, and an offline engine that shuts down right after generate()
abandons the saves still in flight (a long-running server would finish them).
"""

import json
import os
import sys
import time
import urllib.request


def wait_keys(url: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(url, timeout=10) as r:
            have = len(r.read().decode().split())
        if have >= count:
            return
        if time.monotonic() > deadline:
            sys.exit(f"run_llm: the store holds {have} keys, expected {count} after {timeout} s")
        time.sleep(0.1)


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(sys.argv[1])
    args = dict(model=spec["model"], skip_tokenizer_init=True, dtype="bfloat16", max_model_len=512,
                max_num_seqs=8, enforce_eager=True, kv_cache_memory_bytes=64 << 20, seed=0,
                kv_transfer_config=spec["kv"])
    # A GPU host's additions (vllm_harness.ENGINE_ARGS), winning as a server's later flags do.
    args.update(json.loads(os.environ.get("MOONCAKE_E2E_VLLM_ENGINE_ARGS") or "{}"))
    llm = LLM(**args)
    # What the engine settled on, which may not be what it was asked for.
    block = llm.llm_engine.vllm_config.cache_config.block_size
    print(f"run_llm: blocks of {block} tokens", flush=True)
    params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], ignore_eos=True,
                            detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params)
    with open(sys.argv[2], "w") as f:
        json.dump([list(o.outputs[0].token_ids) for o in outs], f)
    if spec.get("wait_keys"):
        wait = dict(spec["wait_keys"])
        if wait["count"] == "full_blocks":
            wait["count"] = sum(len(p) // block for p in spec["prompts"])
        wait_keys(**wait)


if __name__ == "__main__":
    main()
