/* How the ABI grows (mooncake.h, VERSIONING): structs passed in with the
 * struct_size of an older header or a newer one, and a destroy that
 * cancels the calls blocked on its handle. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "transfer_engine_c.h"

/* A struct as a caller of another header version lays it out: the bytes
 * of *src up to size, in a buffer whose bytes past them are fill. */
typedef struct {
    unsigned char bytes[1024];
} blob_t;

static void *as_version(blob_t *b, const void *src, size_t src_len, uint32_t size, unsigned char fill) {
    memset(b->bytes, fill, sizeof b->bytes);
    memcpy(b->bytes, src, src_len < size ? src_len : size);
    memcpy(b->bytes, &size, sizeof size); /* struct_size comes first */
    return b->bytes;
}

void test_struct_versions(void) {
    blob_t b;
    mc_engine_t e = 0;
    mc_engine_config_t cfg;
    mc_engine_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.transport = "tcp";

    /* The sizes are prefixes of the struct as it is now. */
    CHECK(MC_ENGINE_CONFIG_SIZE_V1 <= sizeof(mc_engine_config_t));
    CHECK(MC_STORE_CONFIG_SIZE_V1 < MC_STORE_CONFIG_SIZE_V2);
    CHECK(MC_STORE_CONFIG_SIZE_V2 < MC_STORE_CONFIG_SIZE_V3);
    CHECK(MC_STORE_CONFIG_SIZE_V3 < MC_STORE_CONFIG_SIZE_V4);
    CHECK(MC_STORE_CONFIG_SIZE_V4 < MC_STORE_CONFIG_SIZE_V5);
    CHECK(MC_STORE_CONFIG_SIZE_V5 < MC_STORE_CONFIG_SIZE_V6);
    CHECK(MC_STORE_CONFIG_SIZE_V6 <= sizeof(mc_store_config_t));
    CHECK(MC_REPLICATE_CONFIG_SIZE_V1 < MC_REPLICATE_CONFIG_SIZE_V2);
    CHECK(MC_REPLICATE_CONFIG_SIZE_V2 <= sizeof(mc_replicate_config_t));

    /* Version 1's size, garbage past it: what is past it is not read. */
    REQUIRE_MC(MC_OK, mc_engine_create(as_version(&b, &cfg, sizeof cfg, MC_ENGINE_CONFIG_SIZE_V1, 0xab), &e, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));

    /* A newer header's struct: unknown bytes past ours that are zero are
     * accepted, a nonzero one refused (a setting this library would not
     * carry out), as is a size below version 1's or a wild one. */
    uint32_t newer = (uint32_t)sizeof cfg + 24;
    e = 0;
    REQUIRE_MC(MC_OK, mc_engine_create(as_version(&b, &cfg, sizeof cfg, newer, 0), &e, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    as_version(&b, &cfg, sizeof cfg, newer, 0);
    b.bytes[sizeof cfg + 17] = 1;
    e = 0;
    CHECK_MC(MC_ERR_STRUCT_SIZE, mc_engine_create((mc_engine_config_t *)b.bytes, &e, &E));
    CHECK_EQ(e, 0);
    CHECK_MC(MC_ERR_STRUCT_SIZE,
             mc_engine_create(as_version(&b, &cfg, sizeof cfg, MC_ENGINE_CONFIG_SIZE_V1 - 8, 0), &e, &E));
    cfg.struct_size = 1u << 20;
    CHECK_MC(MC_ERR_STRUCT_SIZE, mc_engine_create(&cfg, &e, &E));
    CHECK_EQ(e, 0);

    /* The store config's checks come before the store dials its master. */
    mc_store_config_t sc;
    mc_store_config_init(&sc);
    sc.master = "127.0.0.1:1";
    mc_store_t s = 0;
    CHECK_MC(MC_ERR_STRUCT_SIZE,
             mc_store_create(as_version(&b, &sc, sizeof sc, MC_STORE_CONFIG_SIZE_V1 - 4, 0), &s, &E));
    as_version(&b, &sc, sizeof sc, (uint32_t)sizeof sc + 8, 0);
    b.bytes[sizeof sc] = 7;
    CHECK_MC(MC_ERR_STRUCT_SIZE, mc_store_create((mc_store_config_t *)b.bytes, &s, &E));
    CHECK_EQ(s, 0);
    /* between two versions: half of op_timeout_ms */
    mc_error_t err;
    CHECK_EQ(mc_store_create(as_version(&b, &sc, sizeof sc, MC_STORE_CONFIG_SIZE_V1 + 4, 0), &s, &err),
             MC_ERR_STRUCT_SIZE);
    CHECK(strstr(err.message, "no published version") != NULL);
    CHECK_EQ(s, 0);
    /* ABI 1.12's tls_server_name without TLS on: refused, not plaintext. */
    sc.tls_server_name = "masters.test";
    CHECK_EQ(mc_store_create(&sc, &s, &err), MC_STORE_ERR_INVALID_PARAMS);
    CHECK(strstr(err.message, "TLS server name") != NULL);
    CHECK_EQ(s, 0);
}

/* The store side against a real store: a version 1 config (ABI 1.0, no
 * op_timeout_ms) with garbage where op_timeout_ms is now, a replicate
 * config of a newer header. */
void test_store_struct_versions(void) {
    blob_t b, rb;
    mc_store_config_t sc;
    mc_store_config_init(&sc);
    sc.master = getenv("MC_TEST_MASTER");
    sc.local_hostname = "127.0.0.1";
    sc.protocol = "tcp";
    sc.segment_size = 16 << 20;
    sc.local_buffer_size = 16 << 20;
    mc_store_t s = 0;
    /* 0xff bytes read as op_timeout_ms would be out of range */
    REQUIRE_MC(MC_OK, mc_store_create(as_version(&b, &sc, sizeof sc, MC_STORE_CONFIG_SIZE_V1, 0xff), &s, &E));
    /* ABI 1.10's size: garbage where tls_server_name is now is not read
     * (read, it would be a wild pointer, or a name without TLS). */
    mc_store_t v5 = 0;
    CHECK_MC(MC_OK, mc_store_create(as_version(&b, &sc, sizeof sc, MC_STORE_CONFIG_SIZE_V5, 0xff), &v5, &E));
    if (v5 != 0) CHECK_MC(MC_OK, mc_store_close(v5, &E));

    char key[64];
    snprintf(key, sizeof key, "capi-%d-versions", (int)getpid());
    uint8_t v[64] = {1, 2, 3}, out[64];
    uint64_t n = 0;
    mc_replicate_config_t rc;
    mc_replicate_config_init(&rc);
    CHECK_MC(MC_OK, mc_store_put(s, key, v, sizeof v, as_version(&rb, &rc, sizeof rc, MC_REPLICATE_CONFIG_SIZE_V1, 0x77), &E));
    CHECK_MC(MC_OK, mc_store_get(s, key, out, sizeof out, &n, &E));
    CHECK_EQ(n, sizeof v);
    CHECK(memcmp(out, v, sizeof v) == 0);
    CHECK_MC(MC_OK, mc_store_upsert(s, key, v, sizeof v, as_version(&rb, &rc, sizeof rc, sizeof rc + 16, 0), &E));
    as_version(&rb, &rc, sizeof rc, sizeof rc + 16, 0);
    rb.bytes[sizeof rc + 15] = 0x80;
    CHECK_MC(MC_ERR_STRUCT_SIZE, mc_store_upsert(s, key, v, sizeof v, (mc_replicate_config_t *)rb.bytes, &E));
    CHECK_MC(MC_OK, mc_store_remove(s, key, 1, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
}

/* ABI 1.10's tenant_id: a store of a tenant and one of ABI 1.8's size
 * (garbage where tenant_id is now: not read, the default tenant) put the
 * same key and each reads its own value back. */
void test_store_tenants(void) {
    blob_t b;
    mc_store_config_t sc;
    mc_store_config_init(&sc);
    sc.master = getenv("MC_TEST_MASTER");
    sc.local_hostname = "127.0.0.1";
    sc.protocol = "tcp";
    sc.segment_size = 16 << 20;
    sc.local_buffer_size = 16 << 20;
    mc_store_t old = 0, acme = 0;
    REQUIRE_MC(MC_OK, mc_store_create(as_version(&b, &sc, sizeof sc, MC_STORE_CONFIG_SIZE_V4, 0xff), &old, &E));
    sc.tenant_id = "acme";
    REQUIRE_MC(MC_OK, mc_store_create(&sc, &acme, &E));
    sc.tenant_id = "bad tenant";
    mc_store_t bad = 0;
    mc_error_t err;
    CHECK_EQ(mc_store_create(&sc, &bad, &err), MC_STORE_ERR_INVALID_PARAMS);
    CHECK(strstr(err.message, "tenant") != NULL);
    CHECK_EQ(bad, 0);

    char key[64];
    snprintf(key, sizeof key, "capi-%d-tenants", (int)getpid());
    uint8_t v1[32] = {1}, v2[32] = {2}, out[32];
    uint64_t n = 0;
    CHECK_MC(MC_OK, mc_store_put(old, key, v1, sizeof v1, NULL, &E));
    CHECK_MC(MC_OK, mc_store_put(acme, key, v2, sizeof v2, NULL, &E));
    CHECK_MC(MC_OK, mc_store_get(old, key, out, sizeof out, &n, &E));
    CHECK(n == sizeof v1 && out[0] == 1);
    CHECK_MC(MC_OK, mc_store_get(acme, key, out, sizeof out, &n, &E));
    CHECK(n == sizeof v2 && out[0] == 2);
    CHECK_MC(MC_OK, mc_store_remove(acme, key, 1, &E));
    CHECK_MC(MC_STORE_ERR_OBJECT_NOT_FOUND, mc_store_get(acme, key, out, sizeof out, &n, &E));
    CHECK_MC(MC_OK, mc_store_get(old, key, out, sizeof out, &n, &E));
    CHECK_MC(MC_OK, mc_store_remove(old, key, 1, &E));
    CHECK_MC(MC_OK, mc_store_close(acme, &E));
    CHECK_MC(MC_OK, mc_store_close(old, &E));
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct blocked_open {
    mc_engine_t e;
    const char *name;
    mc_status_t st;
    mc_error_t err;
    double done;
};

static void *open_blocked(void *arg) {
    struct blocked_open *o = arg;
    mc_segment_t seg;
    o->st = mc_engine_open_segment(o->e, o->name, &seg, &o->err);
    o->done = seconds();
    return NULL;
}

struct te_blocked_open {
    transfer_engine_t te;
    const char *name;
    segment_id_t id;
    double done;
};

static void *te_open_blocked(void *arg) {
    struct te_blocked_open *o = arg;
    o->id = openSegment(o->te, o->name);
    o->done = seconds();
    return NULL;
}

/* A thread opens a segment whose peer never answers, with a minute to
 * wait; destroying the engine from another thread cancels the open: both
 * return promptly, the open with MC_ERR_CANCELED. */
void test_destroy_cancels(void) {
    int ln = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(ln >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    REQUIRE(bind(ln, (struct sockaddr *)&sa, sizeof sa) == 0);
    REQUIRE(listen(ln, 4) == 0);
    REQUIRE(getsockname(ln, (struct sockaddr *)&sa, &sl) == 0);
    char name[32];
    snprintf(name, sizeof name, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));

    mc_engine_config_t cfg;
    mc_engine_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.transport = "tcp";
    cfg.timeout_ms = 60000;
    struct blocked_open o = {.name = name};
    if (mc_engine_create(&cfg, &o.e, &o.err) != MC_OK) {
        close(ln);
        REQUIRE(!"mc_engine_create");
    }
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, open_blocked, &o) == 0);
    /* The open is in progress once its handshake connection arrives. */
    struct pollfd pfd = {.fd = ln, .events = POLLIN};
    CHECK_EQ(poll(&pfd, 1, 20000), 1);
    int conn = accept(ln, NULL, NULL);
    CHECK(conn >= 0);
    double t0 = seconds();
    CHECK_MC(MC_OK, mc_engine_destroy(o.e, &E));
    double destroyed = seconds();
    pthread_join(t, NULL);
    CHECK_EQ(o.st, MC_ERR_CANCELED);
    CHECK_EQ(o.err.code, MC_ERR_CANCELED);
    CHECK_EQ(o.err.domain, MC_DOMAIN_ABI);
    CHECK(strstr(o.err.message, "destroyed") != NULL);
    /* well within the minute the open had */
    CHECK(destroyed - t0 < 10);
    CHECK(o.done - t0 < 10);
    CHECK(strcmp(mc_status_name(MC_DOMAIN_ENGINE, MC_ERR_CANCELED), "CANCELED") == 0);
    if (conn >= 0) close(conn);

    /* The same through the Mooncake API, whose open waits 30 s. */
    struct te_blocked_open c = {.name = name};
    c.te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1);
    REQUIRE(c.te != NULL);
    REQUIRE(pthread_create(&t, NULL, te_open_blocked, &c) == 0);
    CHECK_EQ(poll(&pfd, 1, 20000), 1);
    conn = accept(ln, NULL, NULL);
    CHECK(conn >= 0);
    t0 = seconds();
    destroyTransferEngine(c.te);
    pthread_join(t, NULL);
    CHECK_EQ(c.id, -1);
    CHECK(c.done - t0 < 10);
    if (conn >= 0) close(conn);
    close(ln);
}

/* ---- a store peer that falls silent ---- */

/* store_peer_config is the config of the stores of these tests; op_timeout
 * is op_timeout_ms (0: none). */
static void store_peer_config(mc_store_config_t *cfg, uint64_t op_timeout) {
    mc_store_config_init(cfg);
    cfg->master = getenv("MC_TEST_MASTER");
    cfg->local_hostname = "127.0.0.1";
    cfg->protocol = "tcp";
    cfg->segment_size = 16 << 20;
    cfg->local_buffer_size = 16 << 20;
    cfg->op_timeout_ms = op_timeout;
}

/* store_peer_main is the peer of mode "store": a store contributing a
 * segment, printing "READY <segment name> 0 0", then answering
 *
 *   SPUT key len seed   put len bytes of pattern seed under key, its
 *                       replica on this store's segment -> OK | ERR <code>
 *   QUIT                close and exit 0 if all went well */
int store_peer_main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    mc_store_config_t cfg;
    store_peer_config(&cfg, 0);
    mc_store_t s = 0;
    mc_error_t err;
    if (mc_store_create(&cfg, &s, &err) != MC_OK) {
        fprintf(stderr, "store peer: %s\n", err.message);
        return 3;
    }
    char name[128];
    if (mc_store_name(s, name, sizeof name, NULL, NULL) != MC_OK) return 5;
    printf("READY %s 0 0\n", name);
    char line[1024], key[256];
    unsigned long long len;
    unsigned seed;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "SPUT %255s %llu %u", key, &len, &seed) == 3) {
            uint8_t *v = malloc(len);
            if (v == NULL) return 2;
            fill(v, 0, len, seed);
            const char *here[] = {name};
            mc_replicate_config_t rc;
            mc_replicate_config_init(&rc);
            rc.preferred_segments = here;
            rc.n_preferred = 1;
            mc_status_t st = mc_store_put(s, key, v, len, &rc, NULL);
            free(v);
            if (st == MC_OK)
                printf("OK\n");
            else
                printf("ERR %d\n", st);
        } else if (strncmp(line, "QUIT", 4) == 0) {
            break;
        } else {
            printf("ERR unknown command\n");
        }
    }
    return mc_store_close(s, NULL) == MC_OK ? 0 : 7;
}

/* tcp_established counts the established TCP connections to port on this
 * host (/proc/net/tcp): what a connect that the peer's kernel completed
 * but the stopped peer never accepted looks like. */
static int tcp_established(unsigned port) {
    FILE *f = fopen("/proc/net/tcp", "r");
    if (f == NULL) return -1;
    char line[512];
    int n = 0;
    if (!fgets(line, sizeof line, f)) { /* the header */
        fclose(f);
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        unsigned lport, rport, state;
        if (sscanf(line, " %*d: %*8x:%x %*8x:%x %x", &lport, &rport, &state) == 3 && rport == port && state == 1)
            n++;
    }
    fclose(f);
    return n;
}

struct blocked_get {
    mc_store_t s;
    const char *key;
    mc_status_t st;
    mc_error_t err;
    double done;
};

static void *get_blocked(void *arg) {
    struct blocked_get *g = arg;
    uint8_t buf[4096];
    uint64_t n = 0;
    g->st = mc_store_get(g->s, g->key, buf, sizeof buf, &n, &g->err);
    g->done = seconds();
    return NULL;
}

/* A store peer holds the only replica of a key and stops (SIGSTOP): its
 * kernel still completes connections, nobody answers them. A get from a
 * store with op_timeout_ms fails with MC_ERR_TIMED_OUT once that passes;
 * a get from one without blocks until the store is closed from another
 * thread, which cancels it (MC_ERR_CANCELED) and returns promptly. */
void test_store_silent_peer(void) {
    peer_t p;
    REQUIRE(peer_start(&p, "store") == 0);
    char reply[256], key[64];
    snprintf(key, sizeof key, "capi-%d-silent", (int)getpid());
    REQUIRE(peer_cmd(&p, reply, sizeof reply, "SPUT %s 4096 5", key) == 0);
    CHECK(strcmp(reply, "OK") == 0);
    const char *colon = strrchr(p.name, ':');
    REQUIRE(colon != NULL);
    unsigned port = (unsigned)atoi(colon + 1);

    mc_store_config_t cfg;
    mc_store_t timed = 0, untimed = 0;
    store_peer_config(&cfg, 300);
    REQUIRE_MC(MC_OK, mc_store_create(&cfg, &timed, &E));
    store_peer_config(&cfg, 0);
    REQUIRE_MC(MC_OK, mc_store_create(&cfg, &untimed, &E));
    mc_replica_desc_t rd[4];
    size_t nrep = 0;
    CHECK_MC(MC_OK, mc_store_get_replicas(timed, key, rd, 4, &nrep, &E));
    REQUIRE(nrep == 1 && strcmp(rd[0].segment_name, p.name) == 0); /* only on the peer */

    REQUIRE(kill(p.pid, SIGSTOP) == 0);
    int before = tcp_established(port);

    /* the blocked get, canceled by close */
    struct blocked_get g = {.s = untimed, .key = key};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, get_blocked, &g) == 0);
    double t0 = seconds();
    while (tcp_established(port) <= before && seconds() - t0 < 20) {
        struct timespec ts = {0, 5 * 1000 * 1000}; /* polls readiness */
        nanosleep(&ts, NULL);
    }
    CHECK(tcp_established(port) > before);
    double c0 = seconds();
    CHECK_MC(MC_OK, mc_store_close(untimed, &E));
    double closed = seconds();
    pthread_join(t, NULL);
    CHECK_EQ(g.st, MC_ERR_CANCELED);
    CHECK_EQ(g.err.domain, MC_DOMAIN_ABI);
    CHECK(closed - c0 < 10);
    CHECK(g.done - c0 < 10);

    /* the get with op_timeout_ms */
    uint8_t buf[4096];
    uint64_t n = 0;
    double g0 = seconds();
    CHECK_MC(MC_ERR_TIMED_OUT, mc_store_get(timed, key, buf, sizeof buf, &n, &E));
    CHECK(seconds() - g0 < 10);
    CHECK_MC(MC_OK, mc_store_close(timed, &E));

    kill(p.pid, SIGCONT);
    CHECK_EQ(peer_stop(&p), 0);
}
