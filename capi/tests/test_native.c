/* The native engine API (mooncake.h) end to end: this process writes into
 * and reads from a peer process's memory, with batches, status, wait and
 * notifications both ways. */
#include <unistd.h>

#include "harness.h"

#define LOCAL_LEN (8u << 20)

void test_abi_version(void) {
    uint32_t v = mc_abi_version();
    CHECK_EQ(v, MC_ABI_VERSION);
    CHECK_EQ(v >> 16, MC_ABI_VERSION_MAJOR);
    CHECK(strcmp(mc_status_name(MC_DOMAIN_ENGINE, MC_TE_ERR_BATCH_BUSY), "BATCH_BUSY") == 0);
    CHECK(strcmp(mc_status_name(MC_DOMAIN_STORE, MC_STORE_ERR_OBJECT_NOT_FOUND), "OBJECT_NOT_FOUND") == 0);
    /* -1 means different things in the two tables */
    CHECK(strcmp(mc_status_name(MC_DOMAIN_ENGINE, -1), "INVALID_ARGUMENT") == 0);
    CHECK(strcmp(mc_status_name(MC_DOMAIN_STORE, -1), "INTERNAL") == 0);
    CHECK(strcmp(mc_status_name(MC_DOMAIN_STORE, MC_ERR_INVALID_HANDLE), "INVALID_HANDLE") == 0);
    CHECK(strcmp(mc_status_name(MC_DOMAIN_ENGINE, 12345), "UNKNOWN") == 0);
    CHECK(strcmp(mc_status_name(0, MC_OK), "OK") == 0);
    /* the layouts bindings rely on */
    CHECK_EQ(sizeof(mc_request_t), 40);
    CHECK_EQ(sizeof(mc_transfer_status_t), 16);
    CHECK_EQ(sizeof(mc_error_t), 8 + MC_ERROR_MESSAGE_SIZE);
}

/* transfer_round drives one peer: writes, reads, statuses, a failing
 * request, over the given transport. */
static void transfer_round(const char *peer_mode, const char *transport) {
    peer_t peer;
    REQUIRE(peer_start(&peer, peer_mode) == 0);
    mc_engine_t e = 0;
    char reply[256];
    uint8_t *local = NULL;
    REQUIRE(posix_memalign((void **)&local, 4096, LOCAL_LEN) == 0);
    REQUIRE_MC(MC_OK, test_engine(transport, &e, &E));
    CHECK(e != 0);
    CHECK_MC(MC_OK, mc_engine_register_memory(e, local, LOCAL_LEN, "cpu:0", 1, &E));

    char name[128];
    size_t need = 0;
    CHECK_MC(MC_OK, mc_engine_name(e, name, sizeof name, &need, &E));
    CHECK_EQ(need, strlen(name) + 1);
    uint32_t rpc = 0, data = 0;
    CHECK_MC(MC_OK, mc_engine_ports(e, &rpc, &data, &E));
    CHECK(rpc > 0 && data > 0);

    mc_segment_t seg = 0, again = 0, self = 7;
    CHECK_MC(MC_OK, mc_engine_open_segment(e, peer.name, &seg, &E));
    CHECK(seg != MC_LOCAL_SEGMENT);
    CHECK_MC(MC_OK, mc_engine_open_segment(e, peer.name, &again, &E));
    CHECK_EQ(again, seg);
    CHECK_MC(MC_OK, mc_engine_open_segment(e, name, &self, &E));
    CHECK_EQ(self, MC_LOCAL_SEGMENT);

    /* the peer published its buffer */
    size_t nbuf = 0;
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_engine_segment_buffers(e, seg, NULL, 0, &nbuf, &E));
    CHECK_EQ(nbuf, 1);
    mc_buffer_desc_t bd[4];
    CHECK_MC(MC_OK, mc_engine_segment_buffers(e, seg, bd, 4, &nbuf, &E));
    CHECK_EQ(bd[0].addr, peer.addr);
    CHECK_EQ(bd[0].length, peer.len);

    /* WRITE: 8 requests of different sizes (a slice and a half, one byte,
     * a page...) into different places of the peer's buffer. */
    const uint64_t lens[8] = {1, 4096, 1u << 20, (3u << 20) / 2, 777, 65536, 12345, 2u << 20};
    fill(local, 0, LOCAL_LEN, 5);
    mc_request_t reqs[8];
    uint64_t off = 0;
    for (int i = 0; i < 8; i++) {
        reqs[i] = (mc_request_t){.opcode = MC_OP_WRITE, .local = local + off, .segment = seg,
                                 .remote_addr = peer.addr + off, .length = lens[i]};
        off += lens[i] + 1000; /* gaps stay pattern 0 */
    }
    mc_batch_t b = 0;
    CHECK_MC(MC_OK, mc_engine_allocate_batch(e, 16, &b, &E));
    CHECK(b != 0);
    CHECK_MC(MC_OK, mc_engine_submit(e, b, reqs, 8, &E));
    mc_transfer_status_t ts;
    CHECK_MC(MC_OK, mc_engine_wait(e, b, 10000, &ts, &E));
    CHECK_EQ(ts.state, MC_TRANSFER_COMPLETED);
    CHECK_EQ(ts.error_code, MC_OK);
    uint64_t total = 0;
    for (int i = 0; i < 8; i++) {
        mc_transfer_status_t t;
        CHECK_MC(MC_OK, mc_engine_task_status(e, b, (uint64_t)i, &t, &E));
        CHECK_EQ(t.state, MC_TRANSFER_COMPLETED);
        CHECK_EQ(t.transferred, lens[i]);
        total += lens[i];
    }
    CHECK_EQ(ts.transferred, total);
    CHECK_MC(MC_OK, mc_engine_batch_status(e, b, &ts, &E));
    CHECK_EQ(ts.state, MC_TRANSFER_COMPLETED);
    off = 0;
    for (int i = 0; i < 8; i++) {
        CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK %llu %llu 5", (unsigned long long)off,
                       (unsigned long long)lens[i]) == 0);
        CHECK(strcmp(reply, "OK") == 0);
        CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK %llu 1000 0", (unsigned long long)(off + lens[i])) == 0);
        CHECK(strcmp(reply, "OK") == 0);
        off += lens[i] + 1000;
    }
    CHECK_MC(MC_OK, mc_engine_free_batch(e, b, &E));

    /* READ: the peer fills a region with seed 9; read 3 MiB of it into a
     * different local offset, in one request of several slices. */
    CHECK(peer_cmd(&peer, reply, sizeof reply, "FILL 1048576 3145728 9") == 0);
    CHECK(strcmp(reply, "OK") == 0);
    memset(local, 0, LOCAL_LEN);
    mc_request_t rd = {.opcode = MC_OP_READ, .local = local + 4096, .segment = seg,
                       .remote_addr = peer.addr + (1u << 20), .length = 3u << 20};
    CHECK_MC(MC_OK, mc_engine_allocate_batch(e, 1, &b, &E));
    CHECK_MC(MC_OK, mc_engine_submit(e, b, &rd, 1, &E));
    /* a full batch takes no more */
    CHECK_MC(MC_TE_ERR_TOO_MANY_REQUESTS, mc_engine_submit(e, b, &rd, 1, &E));
    CHECK_MC(MC_OK, mc_engine_wait(e, b, -1, &ts, &E));
    CHECK_EQ(ts.transferred, 3u << 20);
    for (uint64_t i = 0; i < (3u << 20); i++) {
        if (local[4096 + i] != pattern((1u << 20) + i, 9)) {
            CHECK(!"read bytes differ");
            break;
        }
    }
    CHECK_MC(MC_OK, mc_engine_free_batch(e, b, &E));

    /* A write outside what the peer registered fails: the batch and the
     * task say so, the wait returns the failure. */
    mc_request_t bad = {.opcode = MC_OP_WRITE, .local = local, .segment = seg,
                        .remote_addr = peer.addr + peer.len - 10, .length = 100};
    CHECK_MC(MC_OK, mc_engine_allocate_batch(e, 1, &b, &E));
    CHECK_MC(MC_OK, mc_engine_submit(e, b, &bad, 1, &E));
    mc_error_t we;
    mc_status_t st = mc_engine_wait(e, b, 10000, &ts, &we);
    CHECK(st != MC_OK && st != MC_ERR_TIMED_OUT);
    CHECK_EQ(we.code, st);
    CHECK(ts.state == MC_TRANSFER_FAILED || ts.state == MC_TRANSFER_INVALID);
    CHECK(ts.error_code != MC_OK);
    mc_transfer_status_t t;
    CHECK_MC(MC_OK, mc_engine_task_status(e, b, 0, &t, &E));
    CHECK(t.state == MC_TRANSFER_FAILED || t.state == MC_TRANSFER_INVALID);
    CHECK_MC(MC_OK, mc_engine_free_batch(e, b, &E));
    CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK %llu 10 0", (unsigned long long)(peer.len - 10)) == 0);
    CHECK(strcmp(reply, "OK") == 0);

    CHECK_MC(MC_OK, mc_engine_close_segment(e, seg, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_close_segment(e, seg, &E));
    CHECK_MC(MC_OK, mc_engine_unregister_memory(e, local, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    CHECK_EQ(peer_stop(&peer), 0);
    free(local);
}

void test_native_two_process_tcp(void) { transfer_round("native", "tcp"); }

/* The default transport: a peer on this host is reached through shared
 * memory where the machine allows it, else TCP; the bytes are the same. */
void test_native_two_process_auto(void) { transfer_round("native-auto", NULL); }

/* take_notifies returns how many notifications e holds and whether one
 * is (name, msg). */
static int has_notify(mc_engine_t e, const char *name, const char *msg, size_t *count) {
    mc_notify_t *ns = NULL;
    size_t n = 0;
    int found = 0;
    CHECK_MC(MC_OK, mc_engine_get_notifies(e, &ns, &n, &E));
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ(ns[i].name_len, strlen(ns[i].name));
        CHECK_EQ(ns[i].msg_len, strlen(ns[i].msg));
        if (strcmp(ns[i].name, name) == 0 && strcmp(ns[i].msg, msg) == 0) found = 1;
    }
    mc_notifies_free(ns, n);
    if (count) *count = n;
    return found;
}

void test_native_notifications(void) {
    peer_t peer;
    REQUIRE(peer_start(&peer, "native") == 0);
    mc_engine_t e = 0;
    char reply[512], line[512];
    uint8_t *local = malloc(1 << 20);
    REQUIRE_MC(MC_OK, test_engine("tcp", &e, &E));
    CHECK_MC(MC_OK, mc_engine_register_memory(e, local, 1 << 20, NULL, 0, &E));
    mc_segment_t seg;
    REQUIRE_MC(MC_OK, mc_engine_open_segment(e, peer.name, &seg, &E));

    /* none yet */
    mc_notify_t *ns = (mc_notify_t *)1;
    size_t n = 99;
    CHECK_MC(MC_OK, mc_engine_get_notifies(e, &ns, &n, &E));
    CHECK(ns == NULL);
    CHECK_EQ(n, 0);

    /* submit with notify: the peer gets it once the batch completed */
    fill(local, 0, 1 << 20, 3);
    mc_request_t r = {.opcode = MC_OP_WRITE, .local = local, .segment = seg, .remote_addr = peer.addr, .length = 1 << 20};
    mc_batch_t b;
    CHECK_MC(MC_OK, mc_engine_allocate_batch(e, 4, &b, &E));
    CHECK_MC(MC_OK, mc_engine_submit_with_notify(e, b, &r, 1, "agent-A", "kv-ready:req-1", &E));
    CHECK_MC(MC_OK, mc_engine_wait(e, b, 10000, NULL, &E));
    CHECK_MC(MC_OK, mc_engine_free_batch(e, b, &E));
    CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK 0 1048576 3") == 0);
    CHECK(strcmp(reply, "OK") == 0);
    /* the notification follows the completion; poll for it */
    int got = 0;
    for (int tries = 0; tries < 200 && !got; tries++) {
        CHECK(peer_cmd(&peer, reply, sizeof reply, "NOTIFS") == 0);
        int k = atoi(reply + 2);
        for (int i = 0; i < k; i++) {
            if (!fgets(line, sizeof line, peer.from)) break;
            if (strcmp(line, "agent-A\tkv-ready:req-1\n") == 0) got = 1;
        }
        if (!got) usleep(10000);
    }
    CHECK(got);

    /* send_notify: delivered before the call returns */
    CHECK_MC(MC_OK, mc_engine_send_notify(e, seg, "agent-A", "hello peer", &E));
    CHECK(peer_cmd(&peer, reply, sizeof reply, "NOTIFS") == 0);
    CHECK(strcmp(reply, "N 1") == 0);
    CHECK(fgets(line, sizeof line, peer.from) != NULL);
    CHECK(strcmp(line, "agent-A\thello peer\n") == 0);

    /* and the other way: the peer notifies us, twice, in order */
    char name[128];
    CHECK_MC(MC_OK, mc_engine_name(e, name, sizeof name, NULL, &E));
    CHECK(peer_cmd(&peer, reply, sizeof reply, "NOTIFY %s peer-B first", name) == 0);
    CHECK(strcmp(reply, "OK") == 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "NOTIFY %s peer-B second", name) == 0);
    CHECK(strcmp(reply, "OK") == 0);
    CHECK_MC(MC_OK, mc_engine_get_notifies(e, &ns, &n, &E));
    CHECK_EQ(n, 2);
    if (n == 2) {
        CHECK(strcmp(ns[0].name, "peer-B") == 0 && strcmp(ns[0].msg, "first") == 0);
        CHECK(strcmp(ns[1].msg, "second") == 0);
    }
    mc_notifies_free(ns, n);
    /* taken means gone */
    CHECK(!has_notify(e, "peer-B", "first", &n));
    CHECK_EQ(n, 0);

    CHECK_MC(MC_OK, mc_engine_unregister_memory(e, local, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    CHECK_EQ(peer_stop(&peer), 0);
    free(local);
}

/* Two engines in one process, and an engine's own segment: requests to
 * MC_LOCAL_SEGMENT copy within the process; engine-allocated buffers. */
void test_native_loopback_and_local(void) {
    mc_engine_t a = 0, b = 0;
    REQUIRE_MC(MC_OK, test_engine("tcp", &a, &E));
    REQUIRE_MC(MC_OK, test_engine("tcp", &b, &E));
    CHECK(a != b);
    void *abuf = NULL, *bbuf = NULL;
    REQUIRE_MC(MC_OK, mc_engine_allocate_buffer(a, 1 << 20, NULL, &abuf, &E));
    REQUIRE_MC(MC_OK, mc_engine_allocate_buffer(b, 1 << 20, "cpu:0", &bbuf, &E));
    CHECK(abuf != NULL && bbuf != NULL);
    /* allocated buffers are registered already */
    CHECK_MC(MC_TE_ERR_ADDRESS_OVERLAPPED, mc_engine_register_memory(a, abuf, 4096, NULL, 1, &E));

    char bname[128];
    CHECK_MC(MC_OK, mc_engine_name(b, bname, sizeof bname, NULL, &E));
    mc_segment_t seg;
    CHECK_MC(MC_OK, mc_engine_open_segment(a, bname, &seg, &E));
    fill(abuf, 0, 1 << 20, 11);
    mc_request_t reqs[2] = {
        {.opcode = MC_OP_WRITE, .local = abuf, .segment = seg, .remote_addr = (uint64_t)(uintptr_t)bbuf, .length = 1 << 19},
        /* to the engine's own segment: a local copy */
        {.opcode = MC_OP_WRITE, .local = abuf, .segment = MC_LOCAL_SEGMENT,
         .remote_addr = (uint64_t)(uintptr_t)abuf + (1 << 19), .length = 1 << 19},
    };
    mc_batch_t bt;
    CHECK_MC(MC_OK, mc_engine_allocate_batch(a, 2, &bt, &E));
    CHECK_MC(MC_OK, mc_engine_submit(a, bt, reqs, 2, &E));
    CHECK_MC(MC_OK, mc_engine_wait(a, bt, 10000, NULL, &E));
    CHECK_MC(MC_OK, mc_engine_free_batch(a, bt, &E));
    CHECK_EQ(check_pattern(bbuf, 0, 1 << 19, 11), -1);
    CHECK(memcmp(abuf, (uint8_t *)abuf + (1 << 19), 1 << 19) == 0);

    /* an empty batch is WAITING; zero-length submits are no-ops */
    CHECK_MC(MC_OK, mc_engine_allocate_batch(a, 2, &bt, &E));
    mc_transfer_status_t ts;
    CHECK_MC(MC_OK, mc_engine_batch_status(a, bt, &ts, &E));
    CHECK_EQ(ts.state, MC_TRANSFER_WAITING);
    CHECK_MC(MC_OK, mc_engine_free_batch(a, bt, &E));

    CHECK_MC(MC_OK, mc_engine_free_buffer(a, abuf, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_free_buffer(a, abuf, &E));
    /* b's buffer is freed by destroy */
    CHECK_MC(MC_OK, mc_engine_destroy(a, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(b, &E));
}
