/* Mooncake's C API (transfer_engine_c.h) driven exactly the way its two C
 * consumers drive it: NIXL's Mooncake backend plugin and TensorRT-LLM's
 * Mooncake transfer agent (each step names the consumer's method). The
 * remote agent is a peer process on the same library. */
#include <unistd.h>

#include "harness.h"
#include "transfer_engine_c.h"

/* wait_tasks polls getTransferStatus per task as both consumers do
 * (WAITING/PENDING: in progress, COMPLETED: done, anything else: failed)
 * and returns 1 when every task completed. */
static int wait_tasks(transfer_engine_t te, batch_id_t b, size_t n, uint64_t *bytes) {
    for (int spins = 0; spins < 100000; spins++) {
        size_t done = 0;
        uint64_t sum = 0;
        for (size_t i = 0; i < n; i++) {
            struct transfer_status s = {-1, 0};
            if (getTransferStatus(te, b, i, &s) != 0) return 0;
            if (s.status == STATUS_COMPLETED) {
                done++;
                sum += s.transferred_bytes;
            } else if (s.status != STATUS_WAITING && s.status != STATUS_PENDING) {
                return 0;
            }
        }
        if (done == n) {
            if (bytes) *bytes = sum;
            return 1;
        }
        usleep(100);
    }
    return 0;
}

/* peer_has polls the peer until it holds notification (name, msg). */
static int peer_has(peer_t *peer, const char *name, const char *msg) {
    char reply[256], line[1024], want[1024];
    snprintf(want, sizeof want, "%s\t%s\n", name, msg);
    for (int tries = 0; tries < 300; tries++) {
        if (peer_cmd(peer, reply, sizeof reply, "NOTIFS") != 0) return 0;
        int k = atoi(reply + 2), found = 0;
        for (int i = 0; i < k; i++) {
            if (!fgets(line, sizeof line, peer->from)) return 0;
            if (strcmp(line, want) == 0) found = 1;
        }
        if (found) return 1;
        usleep(10000);
    }
    return 0;
}

/* NIXL's Mooncake backend (src/plugins/mooncake): constructor, getConnInfo,
 * loadRemoteConnInfo, registerMem, prepXfer/postXfer (one batch id
 * allocated once, submitTransfer or submitTransferWithNotify with the local
 * agent's name), checkXfer (getTransferStatus per task, then freeBatchID),
 * genNotif, getNotifs, deregisterMem, destructor. */
void test_nixl_sequence(void) {
    peer_t peer;
    REQUIRE(peer_start(&peer, "compat") == 0);
    char reply[256];

    /* constructor: createTransferEngine("P2PHANDSHAKE", ip, "", 0, true) */
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    REQUIRE(te != NULL);
    /* getConnInfo */
    char conn[128] = {0};
    CHECK_EQ(getLocalIpAndPort(te, conn, sizeof conn), 0);
    CHECK(strncmp(conn, "127.0.0.1:", 10) == 0);
    /* registerMem(DRAM): registerLocalMemory(addr, len, "*", 1) */
    size_t len = 4u << 20;
    uint8_t *mem = NULL;
    REQUIRE(posix_memalign((void **)&mem, 4096, len) == 0);
    CHECK_EQ(registerLocalMemory(te, mem, len, "*", 1), 0);
    /* loadRemoteConnInfo: openSegment(conn_info) per remote agent */
    segment_id_t seg = openSegment(te, peer.name);
    CHECK(seg > 0);
    CHECK_EQ(openSegment(te, peer.name), seg);

    /* postXfer NIXL_WRITE with two descriptors */
    fill(mem, 0, len, 21);
    batch_id_t b = allocateBatchID(te, 1024);
    REQUIRE(b != INVALID_BATCH);
    struct transfer_request w[2] = {
        {.opcode = OPCODE_WRITE, .source = mem, .target_id = seg, .target_offset = peer.addr, .length = 1u << 20},
        {.opcode = OPCODE_WRITE, .source = mem + (2u << 20), .target_id = seg,
         .target_offset = peer.addr + (2u << 20), .length = 1u << 20},
    };
    CHECK_EQ(submitTransfer(te, b, w, 2), 0);
    /* checkXfer: NIXL_IN_PROG until every task is COMPLETED */
    uint64_t bytes = 0;
    CHECK(wait_tasks(te, b, 2, &bytes));
    CHECK_EQ(bytes, 2u << 20);
    CHECK_EQ(freeBatchID(te, b), 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK 0 1048576 21") == 0);
    CHECK(strcmp(reply, "OK") == 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK 2097152 1048576 21") == 0);
    CHECK(strcmp(reply, "OK") == 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK 1048576 1048576 0") == 0);
    CHECK(strcmp(reply, "OK") == 0);

    /* postXfer NIXL_READ with a notification (opt_args->hasNotif):
     * submitTransferWithNotify(notify{localAgent, notifMsg}) */
    CHECK(peer_cmd(&peer, reply, sizeof reply, "FILL 3145728 1048576 22") == 0);
    memset(mem, 0, len);
    b = allocateBatchID(te, 1024);
    struct transfer_request r = {.opcode = OPCODE_READ, .source = mem + 4096, .target_id = seg,
                                 .target_offset = peer.addr + (3u << 20), .length = 1u << 20};
    char agent[] = "nixl-agent-0", note[] = "xfer-7-done";
    notify_msg_t nm = {agent, note};
    CHECK_EQ(submitTransferWithNotify(te, b, &r, 1, nm), 0);
    CHECK(wait_tasks(te, b, 1, &bytes));
    CHECK_EQ(freeBatchID(te, b), 0);
    for (uint64_t i = 0; i < (1u << 20); i++)
        if (mem[4096 + i] != pattern((3u << 20) + i, 22)) {
            CHECK(!"read bytes differ");
            break;
        }
    CHECK(peer_has(&peer, "nixl-agent-0", "xfer-7-done"));

    /* genNotif(remote_agent, msg): genNotifyInEngine(segment, msg) */
    notify_msg_t g = {agent, "gen-notif"};
    CHECK_EQ(genNotifyInEngine(te, (uint64_t)seg, g), 0);
    CHECK(peer_has(&peer, "nixl-agent-0", "gen-notif"));

    /* getNotifs: getNotifsFromEngine / freeNotifsMsgBuf */
    int n = -1;
    notify_msg_t *ns = getNotifsFromEngine(te, &n);
    CHECK(ns == NULL);
    CHECK_EQ(n, 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "NOTIFY %s nixl-agent-1 remote-done", conn) == 0);
    CHECK(strcmp(reply, "OK") == 0);
    ns = getNotifsFromEngine(te, &n);
    CHECK_EQ(n, 1);
    if (n == 1 && ns) {
        CHECK(strcmp(ns[0].name, "nixl-agent-1") == 0);
        CHECK(strcmp(ns[0].msg, "remote-done") == 0);
    }
    CHECK_EQ(freeNotifsMsgBuf(ns, n), 0);

    /* deregisterMem, disconnect (closeSegment), destructor */
    CHECK_EQ(unregisterLocalMemory(te, mem), 0);
    CHECK_EQ(closeSegment(te, seg), 0);
    destroyTransferEngine(te);
    CHECK_EQ(peer_stop(&peer), 0);
    free(mem);
}

/* TensorRT-LLM's MooncakeTransferAgent (cache_transmission/mooncake_utils):
 * constructor, registerMemory (ref-counted there, once here),
 * getLocalConnectionInfo, loadRemoteAgent (openSegment "ip:port"),
 * submitTransferRequests (allocateBatchID(1024), transfer_request_t per
 * descriptor, submitTransferWithNotify when a sync message is present),
 * the TransferStatus's wait (getTransferStatus per task, then
 * freeBatchID), notifySyncMessage (base64 message, genNotifyInEngine),
 * getNotifiedSyncMessages (getNotifsFromEngine, freeNotifsMsgBuf),
 * deregisterMemory and the destructor. */
void test_trtllm_sequence(void) {
    peer_t peer;
    REQUIRE(peer_start(&peer, "compat") == 0);
    char reply[256];
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    REQUIRE(te != NULL);
    /* registerMemory: kDRAM descriptors, several regions */
    uint8_t *blocks[3];
    for (int i = 0; i < 3; i++) {
        REQUIRE(posix_memalign((void **)&blocks[i], 4096, 1u << 20) == 0);
        CHECK_EQ(registerLocalMemory(te, blocks[i], 1u << 20, "*", 1), 0);
    }
    char conn[128];
    CHECK_EQ(getLocalIpAndPort(te, conn, sizeof conn), 0);
    /* loadRemoteAgent(name, connectionInfo) */
    segment_id_t seg = openSegment(te, peer.name);
    REQUIRE(seg >= 0);

    /* submitTransferRequests(kWRITE, src=3 blocks, dst=3 remote blocks,
     * syncMessage="ctx-42"): the agent base64-encodes the message */
    for (int i = 0; i < 3; i++) fill(blocks[i], 0, 1u << 20, 30 + i);
    batch_id_t b = allocateBatchID(te, 1024);
    REQUIRE(b != INVALID_BATCH);
    struct transfer_request reqs[3];
    for (int i = 0; i < 3; i++)
        reqs[i] = (struct transfer_request){.opcode = OPCODE_WRITE, .source = blocks[i], .target_id = seg,
                                            .target_offset = peer.addr + (uint64_t)i * (1u << 20),
                                            .length = 1u << 20};
    char self[] = "trtllm-ctx-0", b64[] = "Y3R4LTQy"; /* base64("ctx-42") */
    notify_msg_t nm = {self, b64};
    CHECK_EQ(submitTransferWithNotify(te, b, reqs, 3, nm), 0);
    /* TransferStatus::wait */
    CHECK(wait_tasks(te, b, 3, NULL));
    /* a finished batch frees */
    CHECK_EQ(freeBatchID(te, b), 0);
    for (int i = 0; i < 3; i++) memset(blocks[i], 0, 1u << 20);
    /* kREAD the blocks back: the peer holds block i at offset i MiB */
    for (int i = 0; i < 3; i++) {
        struct transfer_request rd = {.opcode = OPCODE_READ, .source = blocks[i], .target_id = seg,
                                      .target_offset = peer.addr + (uint64_t)i * (1u << 20), .length = 1u << 20};
        b = allocateBatchID(te, 1024);
        CHECK_EQ(submitTransfer(te, b, &rd, 1), 0);
        CHECK(wait_tasks(te, b, 1, NULL));
        CHECK_EQ(freeBatchID(te, b), 0);
        CHECK_EQ(check_pattern(blocks[i], 0, 1u << 20, 30 + i), -1);
    }
    CHECK(peer_has(&peer, "trtllm-ctx-0", "Y3R4LTQy"));

    /* a failing request: kFAILURE from the status, not a crash */
    b = allocateBatchID(te, 1024);
    struct transfer_request bad = {.opcode = OPCODE_WRITE, .source = blocks[0], .target_id = seg,
                                   .target_offset = 4096, .length = 4096};
    CHECK_EQ(submitTransfer(te, b, &bad, 1), 0);
    CHECK(!wait_tasks(te, b, 1, NULL));
    struct transfer_status s = {-1, 0};
    CHECK_EQ(getTransferStatus(te, b, 0, &s), 0);
    CHECK(s.status == STATUS_FAILED || s.status == STATUS_INVALID);
    CHECK_EQ(freeBatchID(te, b), 0);

    /* notifySyncMessage / getNotifiedSyncMessages */
    notify_msg_t sync = {self, "c3luYw=="};
    CHECK_EQ(genNotifyInEngine(te, (uint64_t)seg, sync), 0);
    CHECK(peer_has(&peer, "trtllm-ctx-0", "c3luYw=="));
    CHECK(peer_cmd(&peer, reply, sizeof reply, "NOTIFY %s trtllm-gen-0 Z2VuLWRvbmU=", conn) == 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "NOTIFY %s trtllm-gen-0 c2Vjb25k", conn) == 0);
    int n = 0;
    notify_msg_t *ns = getNotifsFromEngine(te, &n);
    CHECK_EQ(n, 2);
    if (n == 2 && ns) {
        CHECK(strcmp(ns[0].name, "trtllm-gen-0") == 0 && strcmp(ns[0].msg, "Z2VuLWRvbmU=") == 0);
        CHECK(strcmp(ns[1].msg, "c2Vjb25k") == 0);
    }
    freeNotifsMsgBuf(ns, n);

    /* deregisterMemory (batch form), invalidateRemoteAgent is a no-op, destructor */
    void *addrs[3] = {blocks[0], blocks[1], blocks[2]};
    CHECK_EQ(unregisterLocalMemoryBatch(te, addrs, 3), 0);
    destroyTransferEngine(te);
    CHECK_EQ(peer_stop(&peer), 0);
    for (int i = 0; i < 3; i++) free(blocks[i]);
}

/* The two APIs talk to each other: a native engine writes into a Mooncake
 * API peer, the compat side's batch registration and extra functions. */
void test_compat_cross_api(void) {
    peer_t peer;
    REQUIRE(peer_start(&peer, "native") == 0);
    char reply[256];
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
    REQUIRE(te != NULL);
    uint8_t *m1 = malloc(65536), *m2 = malloc(65536);
    buffer_entry_t bl[2] = {{m1, 65536}, {m2, 65536}};
    CHECK_EQ(registerLocalMemoryBatch(te, bl, 2, "cpu:0"), 0);
    /* registering again overlaps */
    CHECK_EQ(registerLocalMemory(te, m1, 100, "*", 1), -7);
    CHECK(!supportFileBuffer(te));
    CHECK(installTransport(te, "rdma", NULL) == NULL);
    CHECK_EQ(uninstallTransport(te, "rdma"), -303);
    file_id_t fid;
    CHECK_EQ(registerLocalFile(te, "/tmp/x", 10, &fid), -303);
    CHECK_EQ(unregisterLocalFile(te, "/tmp/x"), -303);
    CHECK_EQ(syncSegmentCache(te), 0);
    CHECK_EQ(discoverTopology(te), 0);
    CHECK_EQ(removeLocalSegment(te, "x"), 0);
    CHECK_EQ(warmupEfaSegment(te, "x"), 0);
    enableGracefulShutdown(te);
    char links[16];
    CHECK_EQ(showLinks(te, links, sizeof links, 1), 0);
    CHECK(strcmp(links, "[]") == 0);

    segment_id_t seg = openSegmentNoCache(te, peer.name);
    CHECK(seg > 0);
    segment_id_t seg2 = openSegmentNoCache(te, peer.name);
    CHECK(seg2 > 0);
    fill(m2, 0, 65536, 40);
    batch_id_t b = allocateBatchID(te, 4);
    /* file_id left as garbage, as callers built against older headers do */
    struct transfer_request w = {.opcode = OPCODE_WRITE, .source = m2, .target_id = seg2, .file_id = 0xdeadbeef,
                                 .target_offset = peer.addr + 100, .length = 65536};
    CHECK_EQ(submitTransfer(te, b, &w, 1), 0);
    CHECK(wait_tasks(te, b, 1, NULL));
    CHECK_EQ(freeBatchID(te, b), 0);
    /* read it back through a native-API peer's memory */
    memset(m1, 0, 65536);
    b = allocateBatchID(te, 4);
    struct transfer_request back = {.opcode = OPCODE_READ, .source = m1, .target_id = seg2,
                                    .target_offset = peer.addr + 100, .length = 65536};
    CHECK_EQ(submitTransfer(te, b, &back, 1), 0);
    CHECK(wait_tasks(te, b, 1, NULL));
    CHECK_EQ(freeBatchID(te, b), 0);
    CHECK(memcmp(m1, m2, 65536) == 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "FILL 0 65536 41") == 0);
    b = allocateBatchID(te, 4);
    struct transfer_request rd = {.opcode = OPCODE_READ, .source = m1, .target_id = seg2,
                                  .target_offset = peer.addr, .length = 65536};
    CHECK_EQ(submitTransfer(te, b, &rd, 1), 0);
    CHECK(wait_tasks(te, b, 1, NULL));
    CHECK_EQ(freeBatchID(te, b), 0);
    CHECK_EQ(check_pattern(m1, 0, 65536, 41), -1);

    void *addrs[2] = {m1, m2};
    CHECK_EQ(unregisterLocalMemoryBatch(te, addrs, 2), 0);
    CHECK_EQ(unregisterLocalMemory(te, m1), -3); /* gone already: not registered */
    destroyTransferEngine(te);
    CHECK_EQ(peer_stop(&peer), 0);
    free(m1);
    free(m2);
}

/* NIXL's mooncake_backend_test (and TensorRT-LLM, vLLM growing their KV
 * cache): the remote agent registers more memory after this agent opened
 * it, and this agent writes into the new memory with a notification. Both
 * agents run without MC_FORCE_TCP, so the bytes go through shared memory,
 * whose view of the peer must follow its registrations; then the peer
 * frees the buffer and registers another, which must be reached too. */
void test_compat_register_after_open(void) {
    peer_t peer;
    REQUIRE(peer_start(&peer, "compat-auto") == 0);
    char reply[256];
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    REQUIRE(te != NULL);
    size_t len = 1u << 20;
    uint8_t *mem = NULL;
    REQUIRE(posix_memalign((void **)&mem, 4096, len) == 0);
    CHECK_EQ(registerLocalMemory(te, mem, len, "*", 1), 0);
    segment_id_t seg = openSegment(te, peer.name);
    REQUIRE(seg > 0);

    /* a transfer into the memory the peer had at the open */
    fill(mem, 0, 65536, 50);
    batch_id_t b = allocateBatchID(te, 16);
    struct transfer_request w = {.opcode = OPCODE_WRITE, .source = mem, .target_id = seg,
                                 .target_offset = peer.addr, .length = 65536};
    CHECK_EQ(submitTransfer(te, b, &w, 1), 0);
    CHECK(wait_tasks(te, b, 1, NULL));
    CHECK_EQ(freeBatchID(te, b), 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK 0 65536 50") == 0);
    CHECK(strcmp(reply, "OK") == 0);

    char agent[] = "nixl-agent-0";
    for (int round = 0; round < 2; round++) {
        /* registerMem on the remote agent, after loadRemoteConnInfo here */
        unsigned long long more = 0;
        REQUIRE(peer_cmd(&peer, reply, sizeof reply, "ALLOC %zu", len) == 0);
        REQUIRE(sscanf(reply, "OK %llx", &more) == 1);
        fill(mem, 0, len, 51 + round);
        char note[32];
        snprintf(note, sizeof note, "after-register-%d", round);
        notify_msg_t nm = {agent, note};
        b = allocateBatchID(te, 16);
        w = (struct transfer_request){.opcode = OPCODE_WRITE, .source = mem, .target_id = seg,
                                      .target_offset = more, .length = len};
        CHECK_EQ(submitTransferWithNotify(te, b, &w, 1, nm), 0);
        CHECK(wait_tasks(te, b, 1, NULL));
        CHECK_EQ(freeBatchID(te, b), 0);
        CHECK(peer_cmd(&peer, reply, sizeof reply, "XCHECK %llx %zu %d", more, len, 51 + round) == 0);
        CHECK(strcmp(reply, "OK") == 0);
        CHECK(peer_has(&peer, agent, note));
        /* and read back with a plain submitTransfer */
        memset(mem, 0, len);
        b = allocateBatchID(te, 16);
        struct transfer_request r = {.opcode = OPCODE_READ, .source = mem, .target_id = seg,
                                     .target_offset = more, .length = len};
        CHECK_EQ(submitTransfer(te, b, &r, 1), 0);
        CHECK(wait_tasks(te, b, 1, NULL));
        CHECK_EQ(freeBatchID(te, b), 0);
        CHECK_EQ(check_pattern(mem, 0, len, 51 + round), -1);
        /* deregisterMem on the remote agent: the next round registers anew */
        CHECK(peer_cmd(&peer, reply, sizeof reply, "XFREE %llx", more) == 0);
        CHECK(strcmp(reply, "OK") == 0);
    }

    CHECK_EQ(unregisterLocalMemory(te, mem), 0);
    CHECK_EQ(closeSegment(te, seg), 0);
    destroyTransferEngine(te);
    CHECK_EQ(peer_stop(&peer), 0);
    free(mem);
}
