"""One offline vLLM engine: greedy tokens for a list of token-id prompts.

Usage: python run_llm.py SPEC_JSON OUT_JSON, SPEC = {"model", "prompts",
"max_tokens", "kv" (a kv_transfer_config or null)}. Writes the generated
token ids, one list per prompt, to OUT_JSON. Run in a process of its own:
vLLM spawns its workers, hence the __main__ guard.
"""

import json
import sys


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(sys.argv[1])
    llm = LLM(model=spec["model"], skip_tokenizer_init=True, dtype="bfloat16", max_model_len=512,
              max_num_seqs=8, enforce_eager=True, kv_cache_memory_bytes=64 << 20, seed=0,
              kv_transfer_config=spec["kv"])
    params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], ignore_eos=True,
                            detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params)
    with open(sys.argv[2], "w") as f:
        json.dump([list(o.outputs[0].token_ids) for o in outs], f)


if __name__ == "__main__":
    main()
