/* The remote side of two-process tests. The parent runs this binary with
 * "--peer MODE"; the peer starts an engine ("native": mooncake.h over TCP,
 * "native-auto": mooncake.h with the default transport, "compat":
 * Mooncake's transfer_engine_c.h with MC_FORCE_TCP=1, "compat-auto": the
 * same with the default transport, shared memory to this host), registers
 * a buffer filled with pattern 0 and prints
 *
 *   READY <segment name> <buffer address> <buffer length>
 *
 * then answers one command per line:
 *
 *   FILL off len seed      fill its buffer with a pattern -> OK
 *   CHECK off len seed     check its buffer -> OK | BAD <offset>
 *   NOTIFS                 take received notifications -> N <count>,
 *                          then one "<name>\t<msg>" line each
 *   NOTIFY seg name msg    open segment seg, send it (name, msg) -> OK | ERR <code>
 *   ALLOC len              register one more buffer of len bytes -> OK <address>
 *   XCHECK addr len seed   check such a buffer (offsets from its start) -> OK | BAD <offset>
 *   XFREE addr             unregister and free such a buffer -> OK | ERR <code>
 *   QUIT                   unregister, destroy, exit 0 if all went well
 *
 * Mode "store" is a store instead, with commands of its own
 * (store_peer_main in test_abi.c).
 *
 * The parent process cannot fork a copy of itself with a Go runtime in
 * it, so the peer is a fresh exec of the same binary. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "transfer_engine_c.h"

#define PEER_LEN (8u << 20)

extern char **environ;

int peer_start(peer_t *p, const char *mode) {
    int in[2], out[2];
    memset(p, 0, sizeof *p);
    /* The environment is built before fork: the child of a threaded
     * process may only make async-signal-safe calls until it execs. */
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof *env);
    if (env == NULL) return -1;
    memcpy(env, environ, n * sizeof *env);
    if (strcmp(mode, "compat") == 0) env[n++] = "MC_FORCE_TCP=1";
    /* compat-auto: the parent's own MC_FORCE_TCP, if any, goes on. */
    char *argv[] = {"capi_test", "--peer", (char *)mode, NULL};
    if (pipe(in) || pipe(out)) {
        free(env);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        free(env);
        return -1;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execve("/proc/self/exe", argv, env);
        _exit(127);
    }
    free(env);
    close(in[0]);
    close(out[1]);
    p->pid = pid;
    p->to = fdopen(in[1], "w");
    p->from = fdopen(out[0], "r");
    char line[512];
    if (!fgets(line, sizeof line, p->from)) return -1;
    unsigned long long addr, len;
    if (sscanf(line, "READY %127s %llx %llu", p->name, &addr, &len) != 3) {
        fprintf(stderr, "  peer said: %s", line);
        return -1;
    }
    p->addr = addr;
    p->len = len;
    return 0;
}

int peer_cmd(peer_t *p, char *reply, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->to, fmt, ap);
    va_end(ap);
    fputc('\n', p->to);
    fflush(p->to);
    if (!fgets(reply, (int)n, p->from)) return -1;
    reply[strcspn(reply, "\n")] = 0;
    return 0;
}

int peer_stop(peer_t *p) {
    int status = -1;
    if (p->pid <= 0) return -1;
    fputs("QUIT\n", p->to);
    fflush(p->to);
    fclose(p->to);
    fclose(p->from);
    if (waitpid(p->pid, &status, 0) < 0) return -1;
    p->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The peer's engine, whichever API drives it. */
static int compat;
static mc_engine_t eng;
static transfer_engine_t te;

/* Buffers registered by ALLOC, freed by XFREE or at exit. */
static void *extra[16];

static int peer_alloc(unsigned long long len, void **out) {
    size_t i = 0;
    while (i < sizeof extra / sizeof extra[0] && extra[i]) i++;
    if (i == sizeof extra / sizeof extra[0] || posix_memalign(&extra[i], 4096, len)) return -1;
    memset(extra[i], 0, len);
    int st = compat ? registerLocalMemory(te, extra[i], len, "*", 1)
                    : mc_engine_register_memory(eng, extra[i], len, "cpu:0", 1, NULL);
    if (st != 0) {
        free(extra[i]);
        extra[i] = NULL;
        return st;
    }
    *out = extra[i];
    return 0;
}

static int peer_free(void *p) {
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        if (extra[i] != p || p == NULL) continue;
        int st = compat ? unregisterLocalMemory(te, p) : mc_engine_unregister_memory(eng, p, NULL);
        free(p);
        extra[i] = NULL;
        return st;
    }
    return -1;
}

static int peer_notify(const char *seg, const char *name, const char *msg) {
    if (compat) {
        segment_id_t id = openSegment(te, seg);
        if (id < 0) return id;
        notify_msg_t m = {(char *)name, (char *)msg};
        return genNotifyInEngine(te, (uint64_t)id, m);
    }
    mc_segment_t id;
    mc_status_t st = mc_engine_open_segment(eng, seg, &id, NULL);
    if (st != MC_OK) return st;
    return mc_engine_send_notify(eng, id, name, msg, NULL);
}

static void peer_notifs(void) {
    if (compat) {
        int n = -1;
        notify_msg_t *ns = getNotifsFromEngine(te, &n);
        printf("N %d\n", n);
        for (int i = 0; i < n; i++) printf("%s\t%s\n", ns[i].name, ns[i].msg);
        freeNotifsMsgBuf(ns, n);
        return;
    }
    mc_notify_t *ns = NULL;
    size_t n = 0;
    if (mc_engine_get_notifies(eng, &ns, &n, NULL) != MC_OK) {
        printf("N -1\n");
        return;
    }
    printf("N %zu\n", n);
    for (size_t i = 0; i < n; i++) printf("%s\t%s\n", ns[i].name, ns[i].msg);
    mc_notifies_free(ns, n);
}

int peer_main(const char *mode) {
    if (strcmp(mode, "store") == 0) return store_peer_main();
    compat = strncmp(mode, "compat", 6) == 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, PEER_LEN)) return 2;
    fill(buf, 0, PEER_LEN, 0);
    char name[128];
    if (compat) {
        te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
        if (te == NULL) return 3;
        if (registerLocalMemory(te, buf, PEER_LEN, "*", 1) != 0) return 4;
        if (getLocalIpAndPort(te, name, sizeof name) != 0) return 5;
    } else {
        mc_error_t err;
        if (test_engine(strcmp(mode, "native-auto") == 0 ? NULL : "tcp", &eng, &err) != MC_OK) {
            fprintf(stderr, "peer: %s\n", err.message);
            return 3;
        }
        if (mc_engine_register_memory(eng, buf, PEER_LEN, "cpu:0", 1, NULL) != MC_OK) return 4;
        if (mc_engine_name(eng, name, sizeof name, NULL, NULL) != MC_OK) return 5;
    }
    printf("READY %s %llx %u\n", name, (unsigned long long)(uintptr_t)buf, PEER_LEN);
    char line[1024];
    int rc = 0;
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long off, len;
        unsigned seed;
        char a[256], b[256], c[256];
        if (sscanf(line, "FILL %llu %llu %u", &off, &len, &seed) == 3) {
            fill(buf, off, len, seed);
            printf("OK\n");
        } else if (sscanf(line, "CHECK %llu %llu %u", &off, &len, &seed) == 3) {
            long long bad = check_pattern(buf, off, len, seed);
            if (bad < 0)
                printf("OK\n");
            else
                printf("BAD %lld\n", bad);
        } else if (sscanf(line, "ALLOC %llu", &len) == 1) {
            void *p = NULL;
            int st = peer_alloc(len, &p);
            if (st == 0)
                printf("OK %llx\n", (unsigned long long)(uintptr_t)p);
            else
                printf("ERR %d\n", st);
        } else if (sscanf(line, "XCHECK %llx %llu %u", &off, &len, &seed) == 3) {
            long long bad = check_pattern((void *)(uintptr_t)off, 0, len, seed);
            if (bad < 0)
                printf("OK\n");
            else
                printf("BAD %lld\n", bad);
        } else if (sscanf(line, "XFREE %llx", &off) == 1) {
            int st = peer_free((void *)(uintptr_t)off);
            if (st == 0)
                printf("OK\n");
            else
                printf("ERR %d\n", st);
        } else if (strncmp(line, "NOTIFS", 6) == 0) {
            peer_notifs();
        } else if (sscanf(line, "NOTIFY %255s %255s %255s", a, b, c) == 3) {
            int st = peer_notify(a, b, c);
            if (st == 0)
                printf("OK\n");
            else
                printf("ERR %d\n", st);
        } else if (strncmp(line, "QUIT", 4) == 0) {
            break;
        } else {
            printf("ERR unknown command\n");
        }
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (extra[i] && peer_free(extra[i]) != 0) rc = 6;
    if (compat) {
        if (unregisterLocalMemory(te, buf) != 0) rc = 6;
        destroyTransferEngine(te);
    } else {
        if (mc_engine_unregister_memory(eng, buf, NULL) != MC_OK) rc = 6;
        if (mc_engine_destroy(eng, NULL) != MC_OK) rc = 7;
    }
    uint64_t ne = 1, ns = 1;
    mc_debug_live_handles(&ne, &ns, NULL);
    if (ne || ns) rc = 8;
    free(buf);
    return rc;
}
