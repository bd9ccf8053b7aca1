/* fork() and the library. A Go runtime does not survive fork(): the child
 * has only the thread that forked. libmooncake.so starts its runtime at the
 * first call, not when it is loaded, so
 *
 *   - a process that has the library loaded (linked, as here) and forks
 *     before its first call can use it in the child, and in the parent;
 *   - after a fork that follows the first call, every call in the child
 *     fails at once with a message that says why (mooncake.h) or a line on
 *     stderr (Mooncake's API), instead of hanging.
 *
 * Each case runs in a fresh exec of this binary ("--fork MODE", whose
 * library has not been called yet), under alarm(): a call that hangs kills
 * its process with SIGALRM and fails the test instead of hanging the
 * suite.
 *
 * Also here, how libmooncake.so finds its Go library (libmooncake_go.so):
 * a copy of libmooncake.so elsewhere shares the Go library of its build
 * that the process has loaded already (one runtime, one handle table), and
 * a Go library of another build is refused, not called. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "transfer_engine_c.h"

/* Seconds a forked child may take; everything it does takes well under one. */
#define CHILD_SECONDS 30

extern char **environ;

/* wait_child waits for pid and says how it ended unless it exited 0. */
static int wait_child(pid_t pid, const char *what) {
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            perror("waitpid");
            return -1;
        }
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
        fprintf(stderr, "  %s hung: killed by its alarm\n", what);
    else if (WIFSIGNALED(st))
        fprintf(stderr, "  %s died of signal %d\n", what, WTERMSIG(st));
    else
        fprintf(stderr, "  %s exited %d\n", what, WEXITSTATUS(st));
    return -1;
}

/* run_mode runs "capi_test --fork mode" and checks that it exits 0. */
static void run_mode(const char *mode) {
    char *argv[] = {"capi_test", "--fork", (char *)mode, NULL};
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        /* An alarm survives exec: the backstop for the whole mode. */
        alarm(2 * CHILD_SECONDS);
        execve("/proc/self/exe", argv, environ);
        _exit(127);
    }
    CHECK(wait_child(pid, mode) == 0);
}

void test_fork_before_use(void) { run_mode("before"); }

void test_fork_after_use(void) { run_mode("after"); }

/* The native API: two engines, memory registered, a transfer between them. */
static void use_native(void) {
    mc_engine_t a = 0, b = 0;
    REQUIRE_MC(MC_OK, test_engine("tcp", &a, &E));
    REQUIRE_MC(MC_OK, test_engine("tcp", &b, &E));
    enum { LEN = 1 << 18 };
    uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
    REQUIRE(src != NULL && dst != NULL);
    fill(src, 0, LEN, 3);
    CHECK_MC(MC_OK, mc_engine_register_memory(a, src, LEN, NULL, 1, &E));
    CHECK_MC(MC_OK, mc_engine_register_memory(b, dst, LEN, NULL, 1, &E));
    char bname[128];
    mc_segment_t seg = 0;
    CHECK_MC(MC_OK, mc_engine_name(b, bname, sizeof bname, NULL, &E));
    CHECK_MC(MC_OK, mc_engine_open_segment(a, bname, &seg, &E));
    mc_request_t req = {.opcode = MC_OP_WRITE, .local = src, .segment = seg,
                        .remote_addr = (uint64_t)(uintptr_t)dst, .length = LEN};
    mc_batch_t bt = 0;
    CHECK_MC(MC_OK, mc_engine_allocate_batch(a, 1, &bt, &E));
    CHECK_MC(MC_OK, mc_engine_submit(a, bt, &req, 1, &E));
    CHECK_MC(MC_OK, mc_engine_wait(a, bt, 10000, NULL, &E));
    CHECK_MC(MC_OK, mc_engine_free_batch(a, bt, &E));
    CHECK_EQ(check_pattern(dst, 0, LEN, 3), -1);
    CHECK_MC(MC_OK, mc_engine_destroy(a, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(b, &E));
    free(src);
    free(dst);
}

/* Mooncake's API, as NIXL's plugin calls it: a write to the engine's own
 * segment. */
static void use_compat(void) {
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1);
    REQUIRE(te != NULL);
    char name[128];
    CHECK_EQ(getLocalIpAndPort(te, name, sizeof name), 0);
    enum { LEN = 1 << 16 };
    static uint8_t a[LEN], b[LEN];
    fill(a, 0, LEN, 5);
    CHECK_EQ(registerLocalMemory(te, a, LEN, "*", 1), 0);
    CHECK_EQ(registerLocalMemory(te, b, LEN, "*", 1), 0);
    segment_id_t seg = openSegment(te, name);
    CHECK(seg >= 0);
    batch_id_t batch = allocateBatchID(te, 1);
    CHECK(batch != INVALID_BATCH);
    struct transfer_request req = {.opcode = OPCODE_WRITE, .source = a, .target_id = seg,
                                   .target_offset = (uint64_t)(uintptr_t)b, .length = LEN};
    CHECK_EQ(submitTransfer(te, batch, &req, 1), 0);
    struct transfer_status st = {0};
    while (st.status != STATUS_COMPLETED && st.status != STATUS_FAILED && getTransferStatus(te, batch, 0, &st) == 0) {
    }
    CHECK_EQ(st.status, STATUS_COMPLETED);
    CHECK_EQ(check_pattern(b, 0, LEN, 5), -1);
    CHECK_EQ(freeBatchID(te, batch), 0);
    destroyTransferEngine(te);
}

/* The store API, when the suite has a store. */
static void use_store(void) {
    if (getenv("MC_TEST_MASTER") == NULL) return;
    mc_store_config_t cfg;
    mc_store_config_init(&cfg);
    cfg.master = getenv("MC_TEST_MASTER");
    cfg.local_hostname = "127.0.0.1";
    cfg.protocol = "tcp";
    /* No segment of its own: the value goes to the suite's storage node.
     * (With one, the put could land in the other process's segment, which
     * goes, value and all, when that process closes its store.) */
    cfg.segment_size = -1;
    cfg.local_buffer_size = 16 << 20;
    mc_store_t s = 0;
    REQUIRE_MC(MC_OK, mc_store_create(&cfg, &s, &E));
    char key[64];
    snprintf(key, sizeof key, "capi-fork-%d", (int)getpid());
    uint8_t val[4096], out[4096];
    fill(val, 0, sizeof val, 9);
    uint64_t n = 0;
    CHECK_MC(MC_OK, mc_store_put(s, key, val, sizeof val, NULL, &E));
    CHECK_MC(MC_OK, mc_store_get(s, key, out, sizeof out, &n, &E));
    CHECK_EQ(n, sizeof val);
    CHECK(memcmp(val, out, sizeof val) == 0);
    CHECK_MC(MC_OK, mc_store_remove(s, key, 1, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
}

static void use_library(void) {
    use_native();
    use_compat();
    use_store();
}

/* fork_before: fork first, then use the library in the child and the
 * parent at the same time. */
static int fork_before(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        alarm(CHILD_SECONDS);
        h_test = "fork_before_use (child)";
        use_library();
        fflush(NULL);
        _exit(h_failures ? 1 : 0);
    }
    h_test = "fork_before_use (parent)";
    use_library();
    CHECK(wait_child(pid, "the child forked before the first call") == 0);
    return h_failures ? 1 : 0;
}

/* expect_fork_error checks that a mooncake.h call failed because of the fork. */
#define CHECK_FORK_ERROR(call_with_e)                                                                 \
    do {                                                                                              \
        mc_error_t E;                                                                                 \
        memset(&E, 0, sizeof E);                                                                      \
        CHECK_EQ((call_with_e), MC_ERR_PANIC);                                                        \
        CHECK_EQ(E.code, MC_ERR_PANIC);                                                               \
        CHECK_EQ(E.domain, MC_DOMAIN_ABI);                                                            \
        CHECK(strstr(E.message, "forked") != NULL);                                                   \
    } while (0)

/* after_fork_child: the library was used before the fork; nothing that
 * needs the runtime works, and nothing hangs. */
static void after_fork_child(mc_engine_t parent_engine, transfer_engine_t parent_te) {
    /* stderr goes to a pipe for a while, to read what the Mooncake API says */
    int p[2], saved = dup(2);
    REQUIRE(saved >= 0 && pipe(p) == 0);
    REQUIRE(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);
    fflush(stderr);
    dup2(p[1], 2);

    /* out-parameters a failed call clears whatever the handle are cleared
     * here too: set to garbage first */
    mc_engine_t e = 1;
    CHECK_FORK_ERROR(test_engine("tcp", &e, &E));
    CHECK_EQ(e, 0);
    CHECK_FORK_ERROR(mc_engine_ports(parent_engine, NULL, NULL, &E));
    CHECK_EQ(mc_engine_destroy(parent_engine, NULL), MC_ERR_PANIC);
    mc_store_config_t cfg;
    mc_store_config_init(&cfg);
    mc_store_t s = 1;
    CHECK_FORK_ERROR(mc_store_create(&cfg, &s, &E));
    CHECK_EQ(s, 0);
    /* what needs no Go still works */
    CHECK(strcmp(mc_status_name(MC_DOMAIN_NONE, MC_OK), "OK") == 0);
    CHECK_EQ(mc_abi_version(), MC_ABI_VERSION);

    CHECK(createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1) == NULL);
    char name[128];
    CHECK_EQ(getLocalIpAndPort(parent_te, name, sizeof name), -1);
    CHECK(allocateBatchID(parent_te, 1) == INVALID_BATCH);
    CHECK(openSegment(parent_te, "x") < 0);
    /* NIXL loops over the count whatever the result */
    int size = -1;
    CHECK(getNotifsFromEngine(parent_te, &size) == NULL);
    CHECK_EQ(size, 0);
    destroyTransferEngine(parent_te);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    char said[2048] = {0};
    ssize_t n = read(p[0], said, sizeof said - 1);
    close(p[0]);
    CHECK(n > 0);
    /* one line, the first time, for all the calls */
    CHECK(n > 0 && strchr(said, '\n') == said + n - 1);
    CHECK(strstr(said, "forked") != NULL);
    if (h_failures) fprintf(stderr, "  the child's stderr: %s", said);
}

/* fork_after: use the library, fork, check the child. */
static int fork_after(void) {
    h_test = "fork_after_use (parent)";
    mc_engine_t e = 0;
    if (test_engine("tcp", &e, NULL) != MC_OK) return 1;
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1);
    CHECK(te != NULL);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        alarm(CHILD_SECONDS);
        h_test = "fork_after_use (child)";
        after_fork_child(e, te);
        fflush(NULL);
        _exit(h_failures ? 1 : 0);
    }
    CHECK(wait_child(pid, "the child forked after the first call") == 0);
    /* the parent is untouched */
    uint32_t rpc = 0;
    CHECK_MC(MC_OK, mc_engine_ports(e, &rpc, NULL, &E));
    CHECK(rpc != 0);
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    destroyTransferEngine(te);
    return h_failures ? 1 : 0;
}

/* copy_file copies src to dst; with flip_build_id, it changes one byte of
 * the GNU build ID on the way, which makes another build of the file. */
static int copy_file(const char *src, const char *dst, int flip_build_id) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    int ok = in != NULL && out != NULL;
    size_t n = 0, cap = 0;
    char *buf = NULL;
    while (ok) {
        if (n == cap && (buf = realloc(buf, cap = cap ? 2 * cap : 1 << 20)) == NULL) ok = 0;
        size_t r = ok ? fread(buf + n, 1, cap - n, in) : 0;
        if (r == 0) break;
        n += r;
    }
    if (ok && flip_build_id) {
        /* namesz 4, descsz 20, NT_GNU_BUILD_ID, "GNU" */
        static const char note[] = {4, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0, 0, 'G', 'N', 'U', 0};
        char *id = memmem(buf, n, note, sizeof note);
        if (id == NULL || id + sizeof note + 20 > buf + n) ok = 0;
        else id[sizeof note] ^= 0xff;
    }
    if (ok && fwrite(buf, 1, n, out) != n) ok = 0;
    free(buf);
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok ? 0 : -1;
}

/* library_dir writes the directory of the libmooncake.so this binary
 * links to. */
static int library_dir(char *out, size_t n) {
    Dl_info info;
    if (dladdr((void *)&mc_abi_version, &info) == 0 || strrchr(info.dli_fname, '/') == NULL) return -1;
    snprintf(out, n, "%.*s", (int)(strrchr(info.dli_fname, '/') - info.dli_fname), info.dli_fname);
    return 0;
}

typedef mc_status_t (*live_fn)(uint64_t *, uint64_t *, mc_error_t *);
typedef mc_status_t (*create_fn)(const mc_engine_config_t *, mc_engine_t *, mc_error_t *);

/* A copy of libmooncake.so with no Go library beside it, loaded into a
 * process that uses the library already: it finds the Go library of its
 * build that is loaded, so both see one handle table. */
void test_copy_shares_runtime(void) {
    mc_engine_t e = 0;
    REQUIRE_MC(MC_OK, test_engine("tcp", &e, &E));
    char dir[4096], tmp[] = "/tmp/capi-copy-XXXXXX", copy[4200];
    REQUIRE(library_dir(dir, sizeof dir) == 0 && mkdtemp(tmp) != NULL);
    char src[4200];
    snprintf(src, sizeof src, "%s/libmooncake.so", dir);
    snprintf(copy, sizeof copy, "%s/libmooncake.so", tmp);
    int copied = copy_file(src, copy, 0) == 0;
    void *lib = copied ? dlopen(copy, RTLD_NOW | RTLD_LOCAL) : NULL;
    live_fn live = lib ? (live_fn)dlsym(lib, "mc_debug_live_handles") : NULL;
    create_fn create = lib ? (create_fn)dlsym(lib, "mc_engine_create") : NULL;
    uint64_t here = 0, there = 0;
    if (live != NULL) CHECK_MC(MC_OK, live(&there, NULL, &E)); /* its first call */
    unlink(copy);
    rmdir(tmp);
    REQUIRE(copied && live != NULL && create != NULL && (void *)live != (void *)&mc_debug_live_handles);
    CHECK_MC(MC_OK, mc_debug_live_handles(&here, NULL, &E));
    CHECK(here >= 1);
    CHECK_EQ(there, here);
    /* made through the copy, destroyed through the linked library */
    mc_engine_config_t cfg;
    mc_engine_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.transport = "tcp";
    mc_engine_t other = 0;
    CHECK_MC(MC_OK, create(&cfg, &other, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(other, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
}

void test_other_build_refused(void) { run_mode("other-build"); }

/* other_build: a copy of libmooncake.so beside a Go library of another
 * build, in a process that has loaded none yet: every call fails, and none
 * reaches the wrong library. */
static int other_build(void) {
    h_test = "other_build_refused (process)";
    char dir[4096], tmp[] = "/tmp/capi-other-XXXXXX", src[4200], dst[4200];
    if (library_dir(dir, sizeof dir) != 0 || mkdtemp(tmp) == NULL) return 1;
    snprintf(src, sizeof src, "%s/libmooncake.so", dir);
    snprintf(dst, sizeof dst, "%s/libmooncake.so", tmp);
    int ok = copy_file(src, dst, 0) == 0;
    snprintf(src, sizeof src, "%s/libmooncake_go.so", dir);
    snprintf(dst, sizeof dst, "%s/libmooncake_go.so", tmp);
    ok = ok && copy_file(src, dst, 1) == 0;
    snprintf(dst, sizeof dst, "%s/libmooncake.so", tmp);
    void *lib = ok ? dlopen(dst, RTLD_NOW | RTLD_LOCAL) : NULL;
    create_fn create = lib ? (create_fn)dlsym(lib, "mc_engine_create") : NULL;
    CHECK(ok && create != NULL);
    if (create != NULL) {
        /* the first call loads the Go library */
        mc_engine_config_t cfg;
        mc_engine_config_init(&cfg);
        mc_engine_t e = 0;
        mc_error_t E;
        memset(&E, 0, sizeof E);
        CHECK_EQ(create(&cfg, &e, &E), MC_ERR_PANIC);
        CHECK(strstr(E.message, "not the Go library") != NULL);
        if (h_failures) fprintf(stderr, "  message: %s\n", E.message);
    }
    snprintf(dst, sizeof dst, "%s/libmooncake_go.so", tmp);
    unlink(dst);
    snprintf(dst, sizeof dst, "%s/libmooncake.so", tmp);
    unlink(dst);
    rmdir(tmp);
    return h_failures ? 1 : 0;
}

int fork_main(const char *mode) {
    if (strcmp(mode, "before") == 0) return fork_before();
    if (strcmp(mode, "after") == 0) return fork_after();
    if (strcmp(mode, "other-build") == 0) return other_build();
    fprintf(stderr, "capi_test: unknown --fork mode %s\n", mode);
    return 2;
}
