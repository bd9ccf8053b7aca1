/* Bad input is answered with error codes, never a crash: NULL pointers,
 * made-up, foreign and stale handles, wrong lengths and sizes, use after
 * destroy, and a panic inside the library. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "transfer_engine_c.h"

/* every_engine_call runs each engine function with handle h and checks it
 * answers want. */
static void every_engine_call(mc_engine_t h, mc_status_t want) {
    char buf[64];
    size_t n;
    uint32_t p;
    mc_segment_t seg;
    mc_batch_t b;
    mc_transfer_status_t ts;
    mc_notify_t *ns;
    void *addr;
    mc_buffer_desc_t bd[2];
    uint8_t mem[64];
    mc_request_t r = {.opcode = MC_OP_WRITE, .local = mem, .segment = 0, .remote_addr = (uint64_t)(uintptr_t)mem, .length = 1};
    CHECK_MC(want, mc_engine_destroy(h, &E));
    CHECK_MC(want, mc_engine_name(h, buf, sizeof buf, &n, &E));
    CHECK_MC(want, mc_engine_ports(h, &p, &p, &E));
    CHECK_MC(want, mc_engine_register_memory(h, mem, sizeof mem, NULL, 1, &E));
    CHECK_MC(want, mc_engine_unregister_memory(h, mem, &E));
    CHECK_MC(want, mc_engine_allocate_buffer(h, 4096, NULL, &addr, &E));
    CHECK_MC(want, mc_engine_free_buffer(h, mem, &E));
    CHECK_MC(want, mc_engine_open_segment(h, "127.0.0.1:1", &seg, &E));
    CHECK_MC(want, mc_engine_close_segment(h, 1, &E));
    CHECK_MC(want, mc_engine_segment_buffers(h, 0, bd, 2, &n, &E));
    CHECK_MC(want, mc_engine_allocate_batch(h, 4, &b, &E));
    CHECK_MC(want, mc_engine_free_batch(h, 1, &E));
    CHECK_MC(want, mc_engine_submit(h, 1, &r, 1, &E));
    CHECK_MC(want, mc_engine_submit_with_notify(h, 1, &r, 1, "a", "b", &E));
    CHECK_MC(want, mc_engine_task_status(h, 1, 0, &ts, &E));
    CHECK_MC(want, mc_engine_batch_status(h, 1, &ts, &E));
    CHECK_MC(want, mc_engine_wait(h, 1, 0, &ts, &E));
    CHECK_MC(want, mc_engine_send_notify(h, 1, "a", "b", &E));
    CHECK_MC(want, mc_engine_get_notifies(h, &ns, &n, &E));
}

static void every_store_call(mc_store_t h, mc_status_t want) {
    char buf[64];
    size_t n;
    uint64_t u;
    int32_t ex;
    mc_status_t codes[1];
    const char *keys[1] = {"k"};
    const void *vals[1] = {buf};
    void *dsts[1] = {buf};
    uint64_t lens[1] = {8};
    CHECK_MC(want, mc_store_close(h, &E));
    CHECK_MC(want, mc_store_name(h, buf, sizeof buf, &n, &E));
    CHECK_MC(want, mc_store_register_buffer(h, buf, sizeof buf, &E));
    CHECK_MC(want, mc_store_unregister_buffer(h, buf, &E));
    CHECK_MC(want, mc_store_put(h, "k", buf, 8, NULL, &E));
    CHECK_MC(want, mc_store_put_from(h, "k", buf, 8, NULL, &E));
    CHECK_MC(want, mc_store_upsert(h, "k", buf, 8, NULL, &E));
    CHECK_MC(want, mc_store_get(h, "k", buf, sizeof buf, &u, &E));
    CHECK_MC(want, mc_store_get_into(h, "k", buf, sizeof buf, &u, &E));
    CHECK_MC(want, mc_store_get_size(h, "k", &u, &E));
    CHECK_MC(want, mc_store_batch_put(h, keys, vals, lens, 1, NULL, codes, &E));
    CHECK_MC(want, mc_store_batch_put_from(h, keys, vals, lens, 1, NULL, codes, &E));
    CHECK_MC(want, mc_store_batch_upsert(h, keys, vals, lens, 1, NULL, codes, &E));
    CHECK_MC(want, mc_store_batch_get_into(h, keys, dsts, lens, 1, &u, codes, &E));
    CHECK_MC(want, mc_store_exist(h, "k", &ex, &E));
    CHECK_MC(want, mc_store_batch_exist(h, keys, 1, &ex, codes, &E));
    CHECK_MC(want, mc_store_remove(h, "k", 1, &E));
    CHECK_MC(want, mc_store_remove_all(h, 1, &u, &E));
    CHECK_MC(want, mc_store_remove_by_regex(h, "k", 1, &u, &E));
    CHECK_MC(want, mc_store_batch_remove(h, keys, 1, 1, codes, &E));
}

void test_bad_handles(void) {
    /* 0, made-up numbers, all-ones */
    every_engine_call(0, MC_ERR_INVALID_HANDLE);
    every_engine_call(0x4242, MC_ERR_INVALID_HANDLE);
    every_engine_call(UINT64_MAX, MC_ERR_INVALID_HANDLE);
    every_store_call(0, MC_ERR_INVALID_HANDLE);
    every_store_call(0x4242, MC_ERR_INVALID_HANDLE);
    /* a live engine passed as a store is a foreign handle */
    mc_engine_t e;
    REQUIRE_MC(MC_OK, test_engine("tcp", &e, &E));
    every_store_call((mc_store_t)e, MC_ERR_INVALID_HANDLE);
    mc_error_t err;
    CHECK_EQ(mc_store_put((mc_store_t)e, "k", "v", 1, NULL, &err), MC_ERR_INVALID_HANDLE);
    CHECK_EQ(err.domain, MC_DOMAIN_ABI);
    CHECK(strstr(err.message, "engine") != NULL);
    /* ... and the engine still works afterwards */
    char name[64];
    CHECK_MC(MC_OK, mc_engine_name(e, name, sizeof name, NULL, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    /* err may be NULL: the status still comes back */
    CHECK_EQ(mc_engine_destroy(e, NULL), MC_ERR_INVALID_HANDLE);
}

void test_bad_arguments(void) {
    mc_engine_t e = 0;
    mc_engine_config_t cfg;
    /* config: NULL out, short struct_size, reserved, bad values */
    mc_engine_config_init(&cfg);
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_create(&cfg, NULL, &E));
    cfg.struct_size = 8;
    CHECK_MC(MC_ERR_STRUCT_SIZE, mc_engine_create(&cfg, &e, &E));
    CHECK_EQ(e, 0);
    mc_engine_config_init(&cfg);
    cfg.reserved = 1;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_create(&cfg, &e, &E));
    mc_engine_config_init(&cfg);
    cfg.transport = "carrier-pigeon";
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_create(&cfg, &e, &E));
    mc_engine_config_init(&cfg);
    cfg.rpc_port = 70000;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_create(&cfg, &e, &E));
    mc_engine_config_init(&cfg);
    cfg.slice_size = 100;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_create(&cfg, &e, &E));
    mc_engine_config_init(&cfg);
    cfg.metadata = "gopher://nowhere";
    CHECK(mc_engine_create(&cfg, &e, NULL) != MC_OK);
    CHECK_EQ(e, 0);
    /* a NULL config is the default one */
    REQUIRE_MC(MC_OK, mc_engine_create(NULL, &e, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));

    REQUIRE_MC(MC_OK, test_engine("tcp", &e, &E));
    uint8_t *mem = malloc(1 << 16);
    char small[4];
    size_t need = 0;
    /* names: too small a buffer reports the size and still terminates */
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_engine_name(e, small, sizeof small, &need, &E));
    CHECK(need > sizeof small);
    CHECK_EQ(small[3], 0);
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_engine_name(e, NULL, 0, &need, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_name(e, NULL, 10, &need, &E));
    CHECK_MC(MC_OK, mc_engine_ports(e, NULL, NULL, &E));

    /* memory */
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_register_memory(e, NULL, 100, NULL, 1, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_register_memory(e, mem, 0, NULL, 1, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_register_memory(e, mem, UINT64_MAX, NULL, 1, &E));
    CHECK_MC(MC_OK, mc_engine_register_memory(e, mem, 1 << 16, NULL, 1, &E));
    CHECK_MC(MC_TE_ERR_ADDRESS_OVERLAPPED, mc_engine_register_memory(e, mem + 100, 100, NULL, 1, &E));
    CHECK_MC(MC_TE_ERR_ADDRESS_NOT_REGISTERED, mc_engine_unregister_memory(e, mem + 1, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_unregister_memory(e, NULL, &E));
    void *addr = (void *)1;
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_allocate_buffer(e, 4096, NULL, NULL, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_allocate_buffer(e, 0, NULL, &addr, &E));
    CHECK(addr == NULL);
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_free_buffer(e, mem, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_free_buffer(e, NULL, &E));

    /* segments */
    mc_segment_t seg = 0;
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_open_segment(e, NULL, &seg, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_open_segment(e, "127.0.0.1:1", NULL, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_open_segment(e, "no-port-here", &seg, &E));
    CHECK_MC(MC_TE_ERR_SOCKET, mc_engine_open_segment(e, "127.0.0.1:1", &seg, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_close_segment(e, 999, &E));
    size_t count = 0;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_segment_buffers(e, 999, NULL, 0, &count, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_segment_buffers(e, MC_LOCAL_SEGMENT, NULL, 3, &count, &E));
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_engine_segment_buffers(e, MC_LOCAL_SEGMENT, NULL, 0, &count, &E));
    CHECK_EQ(count, 1);

    /* batches */
    mc_batch_t b = 0;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_allocate_batch(e, 0, &b, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_allocate_batch(e, 1, NULL, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_free_batch(e, 12345, &E));
    CHECK_MC(MC_OK, mc_engine_allocate_batch(e, 2, &b, &E));
    mc_request_t r = {.opcode = MC_OP_WRITE, .local = mem, .segment = MC_LOCAL_SEGMENT,
                      .remote_addr = (uint64_t)(uintptr_t)(mem + 4096), .length = 100};
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_submit(e, b, NULL, 1, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_submit(e, b, &r, (size_t)1 << 40, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_submit(e, 777, &r, 1, &E));
    mc_request_t bad = r;
    bad.opcode = 7;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_submit(e, b, &bad, 1, &E));
    bad = r;
    bad.reserved = 3;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_submit(e, b, &bad, 1, &E));
    bad = r;
    bad.local = small; /* not registered */
    CHECK_MC(MC_TE_ERR_ADDRESS_NOT_REGISTERED, mc_engine_submit(e, b, &bad, 1, &E));
    bad = r;
    bad.segment = 4242; /* never opened */
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_submit(e, b, &bad, 1, &E));
    bad = r;
    bad.length = 1 << 20; /* runs past the registered region */
    CHECK_MC(MC_TE_ERR_ADDRESS_NOT_REGISTERED, mc_engine_submit(e, b, &bad, 1, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_submit_with_notify(e, b, &r, 1, NULL, "m", &E));
    mc_transfer_status_t ts;
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_task_status(e, b, 0, &ts, &E)); /* nothing submitted */
    CHECK_MC(MC_OK, mc_engine_submit(e, b, &r, 1, &E));
    CHECK_MC(MC_OK, mc_engine_wait(e, b, 5000, NULL, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_task_status(e, b, 1, &ts, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_task_status(e, b, UINT64_MAX, &ts, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_task_status(e, b, 0, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_batch_status(e, b, NULL, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_wait(e, 999, 0, &ts, &E));
    CHECK_MC(MC_OK, mc_engine_free_batch(e, b, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_free_batch(e, b, &E)); /* twice */
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_task_status(e, b, 0, &ts, &E)); /* freed */

    /* notifications */
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_send_notify(e, 1, NULL, "m", &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_send_notify(e, 999, "n", "m", &E));
    mc_notify_t *ns;
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_get_notifies(e, NULL, &count, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_engine_get_notifies(e, &ns, NULL, &E));
    mc_notifies_free(NULL, 5);

    CHECK_MC(MC_OK, mc_engine_unregister_memory(e, mem, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    free(mem);
}

/* Use after destroy: the handle is stale, every call says so; a handle
 * number is never reused for another object. */
void test_use_after_destroy(void) {
    mc_engine_t e, e2;
    REQUIRE_MC(MC_OK, test_engine("tcp", &e, &E));
    uint8_t mem[4096];
    CHECK_MC(MC_OK, mc_engine_register_memory(e, mem, sizeof mem, NULL, 1, &E));
    mc_batch_t b;
    CHECK_MC(MC_OK, mc_engine_allocate_batch(e, 1, &b, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    every_engine_call(e, MC_ERR_INVALID_HANDLE);
    REQUIRE_MC(MC_OK, test_engine("tcp", &e2, &E));
    CHECK(e2 != e);
    every_engine_call(e, MC_ERR_INVALID_HANDLE);
    CHECK_MC(MC_OK, mc_engine_destroy(e2, &E));

    /* the Mooncake API after destroy */
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    REQUIRE(te != NULL);
    destroyTransferEngine(te);
    destroyTransferEngine(te); /* twice: ignored */
    CHECK_EQ(registerLocalMemory(te, mem, sizeof mem, "*", 1), -1);
    CHECK(allocateBatchID(te, 4) == INVALID_BATCH);
    char buf[64];
    CHECK_EQ(getLocalIpAndPort(te, buf, sizeof buf), -1);
}

/* Mooncake's API: NULL engines and arguments come back as errors. */
void test_compat_bad_input(void) {
    transfer_engine_t none = NULL, junk = (transfer_engine_t)(uintptr_t)0x7777;
    transfer_engine_t engines[2] = {none, junk};
    uint8_t mem[4096];
    char buf[64];
    for (int i = 0; i < 2; i++) {
        transfer_engine_t te = engines[i];
        CHECK_EQ(getLocalIpAndPort(te, buf, sizeof buf), -1);
        CHECK(openSegment(te, "127.0.0.1:1") < 0);
        CHECK(openSegmentNoCache(te, "127.0.0.1:1") < 0);
        CHECK_EQ(closeSegment(te, 1), -1);
        CHECK_EQ(registerLocalMemory(te, mem, sizeof mem, "*", 1), -1);
        CHECK_EQ(unregisterLocalMemory(te, mem), -1);
        buffer_entry_t be = {mem, sizeof mem};
        CHECK_EQ(registerLocalMemoryBatch(te, &be, 1, "*"), -1);
        void *a = mem;
        CHECK_EQ(unregisterLocalMemoryBatch(te, &a, 1), -1);
        CHECK(allocateBatchID(te, 4) == INVALID_BATCH);
        struct transfer_request r = {OPCODE_WRITE, mem, 0, 0, (uint64_t)(uintptr_t)mem, 1};
        CHECK_EQ(submitTransfer(te, 1, &r, 1), -1);
        notify_msg_t nm = {"a", "b"};
        CHECK_EQ(submitTransferWithNotify(te, 1, &r, 1, nm), -1);
        struct transfer_status s;
        CHECK_EQ(getTransferStatus(te, 1, 0, &s), -1);
        CHECK_EQ(freeBatchID(te, 1), -1);
        int n = 42;
        CHECK(getNotifsFromEngine(te, &n) == NULL);
        CHECK_EQ(n, 0);
        CHECK_EQ(genNotifyInEngine(te, 1, nm), -1);
        CHECK_EQ(syncSegmentCache(te), -1);
        CHECK_EQ(uninstallTransport(te, "tcp"), -1);
        destroyTransferEngine(te);
    }
    CHECK_EQ(freeNotifsMsgBuf(NULL, 0), 0);

    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    REQUIRE(te != NULL);
    CHECK(createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 99999, 1) == NULL);
    CHECK(createTransferEngine("gopher://x", "127.0.0.1", "", 0, 1) == NULL);
    CHECK_EQ(getLocalIpAndPort(te, NULL, 10), -1);
    /* truncated like snprintf */
    char tiny[5];
    CHECK_EQ(getLocalIpAndPort(te, tiny, sizeof tiny), 0);
    CHECK(strcmp(tiny, "127.") == 0);
    CHECK(openSegment(te, NULL) < 0);
    CHECK(openSegment(te, "not a name") < 0);
    CHECK_EQ(openSegment(te, "127.0.0.1:1"), -102);
    CHECK_EQ(registerLocalMemory(te, NULL, 10, "*", 1), -1);
    CHECK_EQ(registerLocalMemory(te, mem, 0, "*", 1), -1);
    CHECK_EQ(registerLocalMemory(te, mem, sizeof mem, NULL, 1), 0);
    CHECK_EQ(registerLocalMemoryBatch(te, NULL, 2, "*"), -1);
    CHECK_EQ(registerLocalMemoryBatch(te, NULL, 0, "*"), 0);
    CHECK_EQ(unregisterLocalMemoryBatch(te, NULL, 3), -1);
    batch_id_t b = allocateBatchID(te, 0);
    CHECK(b == INVALID_BATCH);
    b = allocateBatchID(te, 2);
    CHECK(b != INVALID_BATCH);
    struct transfer_request r = {OPCODE_WRITE, mem, LOCAL_SEGMENT, 0, (uint64_t)(uintptr_t)(mem + 2048), 100};
    CHECK_EQ(submitTransfer(te, b, NULL, 1), -1);
    struct transfer_request bad = r;
    bad.opcode = 5;
    CHECK_EQ(submitTransfer(te, b, &bad, 1), -1);
    bad = r;
    bad.target_id = -4;
    CHECK_EQ(submitTransfer(te, b, &bad, 1), -1);
    bad = r;
    bad.source = buf;
    CHECK_EQ(submitTransfer(te, b, &bad, 1), -3);
    CHECK_EQ(submitTransfer(te, INVALID_BATCH, &r, 1), -1);
    CHECK_EQ(submitTransfer(te, b, &r, 1), 0);
    CHECK_EQ(getTransferStatus(te, b, 0, NULL), -1);
    CHECK_EQ(getTransferStatus(te, b, 5, &(struct transfer_status){0, 0}), -1);
    CHECK_EQ(freeBatchID(te, 4242), -1);
    int n;
    CHECK(getNotifsFromEngine(te, NULL) == NULL);
    CHECK(getNotifsFromEngine(te, &n) == NULL);
    notify_msg_t nm = {"a", "b"};
    CHECK_EQ(genNotifyInEngine(te, 999, nm), -1);
    CHECK_EQ(showLinks(te, NULL, 0, 0), -1);
    /* let the local copy finish before unregistering */
    struct transfer_status s = {0, 0};
    for (int i = 0; i < 100000 && s.status != STATUS_COMPLETED; i++) getTransferStatus(te, b, 0, &s);
    CHECK_EQ(s.status, STATUS_COMPLETED);
    CHECK_EQ(freeBatchID(te, b), 0);
    CHECK_EQ(unregisterLocalMemory(te, mem), 0);
    destroyTransferEngine(te);
}

/* A panic inside the library comes back as MC_ERR_PANIC; the process and
 * the library carry on. */
void test_panic_recovered(void) {
    for (int i = 0; i < 3; i++) {
        mc_error_t err;
        CHECK_EQ(mc_debug_panic(&err), MC_ERR_PANIC);
        CHECK_EQ(err.code, MC_ERR_PANIC);
        CHECK_EQ(err.domain, MC_DOMAIN_ABI);
        CHECK(strstr(err.message, "panic") != NULL);
        CHECK_EQ(mc_debug_panic(NULL), MC_ERR_PANIC);
    }
    mc_engine_t e;
    CHECK_MC(MC_OK, test_engine("tcp", &e, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
}

/* Every engine and store the tests made is gone. */
void test_no_leaks(void) {
    uint64_t ne = 99, ns = 99;
    CHECK_MC(MC_OK, mc_debug_live_handles(&ne, &ns, &E));
    CHECK_EQ(ne, 0);
    CHECK_EQ(ns, 0);
}

/* A peer whose handshake socket accepts but never answers makes
 * mc_engine_open_segment fail within the engine's timeout with the engine's
 * socket error, as before the engine kept the deadline as the cause: a
 * handshake that timed out is not MC_ERR_TIMED_OUT. */
void test_silent_peer(void) {
    int ln = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(ln >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    REQUIRE(bind(ln, (struct sockaddr *)&sa, sizeof sa) == 0);
    REQUIRE(listen(ln, 4) == 0); /* the kernel completes connects; nobody reads */
    REQUIRE(getsockname(ln, (struct sockaddr *)&sa, &sl) == 0);
    char name[32];
    snprintf(name, sizeof name, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));

    mc_engine_config_t cfg;
    mc_engine_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.transport = "tcp";
    cfg.timeout_ms = 300;
    mc_engine_t e = 0;
    mc_error_t err;
    if (mc_engine_create(&cfg, &e, &err) != MC_OK) {
        close(ln);
        REQUIRE(!"mc_engine_create");
    }
    mc_segment_t seg;
    CHECK_MC(MC_TE_ERR_SOCKET, mc_engine_open_segment(e, name, &seg, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    close(ln);
}
