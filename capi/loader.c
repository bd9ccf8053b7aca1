//go:build ignore

/* The loader of libmooncake.so. Not part of the Go build (the constraint
 * above): scripts/build-capi.sh compiles it, shim.c and the generated
 * forwarders into libmooncake.so, a C library with no runtime of its own in
 * front of the Go one, libmooncake_go.so.
 *
 * A Go runtime starts its threads when its library is loaded, and fork()
 * copies only the calling thread: the runtime of a process that forked is
 * dead in the child, and a call into it hangs. So libmooncake.so loads the
 * Go library at the first call that needs Go, not when it is loaded
 * itself: a host may load it (link it, dlopen it, import the Python
 * package) and fork before its first call, and each process that calls
 * starts a runtime of its own. After a fork that follows the first call
 * the child cannot use the library; every call there fails at once, with a
 * message that says why, instead of hanging.
 *
 * The Go library is the one of this build (its GNU build ID is compiled in
 * here): one the process has loaded already, through another copy of
 * libmooncake.so, so that the process keeps one runtime; else the file
 * beside this library, which must have that build ID. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader.h"

/* The Go library, a private file installed beside libmooncake.so. */
#define GO_LIBRARY "libmooncake_go.so"

int mcgo_state = MCGO_UNLOADED;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pid_t runtime_pid;                 /* where the Go runtime started */
static char why[MC_ERROR_MESSAGE_SIZE];   /* set before mcgo_state becomes MCGO_BROKEN */
static int complained;                    /* mcgo_complain wrote why */
static int atfork_registered;

static void broken(const char *format, ...) __attribute__((format(printf, 1, 2)));

static void broken(const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    vsnprintf(why, sizeof why, format, ap);
    va_end(ap);
    __atomic_store_n(&mcgo_state, MCGO_BROKEN, __ATOMIC_RELEASE);
}

static void broken_by_fork(pid_t parent) {
    broken("libmooncake: this process (pid %d) was forked after the library had started its Go runtime in "
           "process %d; a Go runtime does not survive fork(), so the library cannot run here. Make the first "
           "call after the fork, or start the child with exec (multiprocessing: spawn, forkserver)",
           (int)getpid(), (int)parent);
}

/* after_fork runs in the child of every fork() of a process that has
 * called the library: a runtime started (or starting) in the parent has
 * none of its threads here. This is what keeps the forwarders' test to one
 * load of mcgo_state. */
static void after_fork(void) {
    complained = 0;
    switch (__atomic_load_n(&mcgo_state, __ATOMIC_RELAXED)) {
    case MCGO_UNLOADED:
        return;
    case MCGO_BROKEN:
        if (runtime_pid == 0) return; /* the load failed in the parent; so it does here */
        break;
    }
    broken_by_fork(runtime_pid ? runtime_pid : getppid());
}

/* go_library_path writes the path of the Go library to out: beside this
 * library, or beside the file it links to. */
static int go_library_path(char *out, size_t n) {
    Dl_info info;
    if (dladdr((void *)&go_library_path, &info) == 0 || info.dli_fname == NULL) {
        broken("libmooncake: cannot find its own file (dladdr) to load %s beside it", GO_LIBRARY);
        return 0;
    }
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash == NULL) {
        snprintf(out, n, "%s", GO_LIBRARY); /* found by search: so is the Go library */
        return 1;
    }
    snprintf(out, n, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, GO_LIBRARY);
    if (access(out, F_OK) == 0) return 1;
    char real[PATH_MAX];
    if (realpath(info.dli_fname, real) != NULL && (slash = strrchr(real, '/')) != NULL) {
        snprintf(out, n, "%.*s/%s", (int)(slash - real), real, GO_LIBRARY);
        if (access(out, F_OK) == 0) return 1;
    }
    broken("libmooncake: %s is not installed beside %s (the two files are one library)", GO_LIBRARY,
           info.dli_fname);
    return 0;
}

/* note_has_build_id reports whether a PT_NOTE segment holds our build ID. */
static int note_has_build_id(const unsigned char *p, size_t len, size_t align) {
    size_t a = align == 8 ? 8 : 4;
#define UP(n) (((n) + a - 1) & ~(a - 1))
    while (len >= sizeof(ElfW(Nhdr))) {
        const ElfW(Nhdr) *n = (const void *)p;
        size_t name = sizeof *n, desc = name + UP(n->n_namesz), end = desc + UP(n->n_descsz);
        if (desc + n->n_descsz > len) return 0;
        if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && memcmp(p + name, "GNU", 4) == 0 &&
            n->n_descsz == mcgo_build_id_len && memcmp(p + desc, mcgo_build_id, mcgo_build_id_len) == 0)
            return 1;
        if (end >= len) return 0;
        p += end;
        len -= end;
    }
#undef UP
    return 0;
}

/* find_ours is a dl_iterate_phdr callback: it copies the path of a loaded
 * object with our build ID to the buffer of PATH_MAX bytes in data. */
static int find_ours(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0') return 0;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_NOTE &&
            note_has_build_id((const unsigned char *)(info->dlpi_addr + ph->p_vaddr), ph->p_memsz, ph->p_align)) {
            snprintf(data, PATH_MAX, "%s", info->dlpi_name);
            return 1;
        }
    }
    return 0;
}

/* loaded_path writes to path (PATH_MAX bytes) the file of the Go library of
 * this build if this process has it loaded already: loaded by another copy
 * of libmooncake.so (a Python wheel's beside a NIXL plugin's), whose
 * runtime this one shares, or inherited through fork. */
static int loaded_path(char *path) { return dl_iterate_phdr(find_ours, path); }

static void load(void) {
    /* glibc runs a once routine that a fork() interrupted again in the
     * child, where after_fork has marked the library broken. */
    if (__atomic_load_n(&mcgo_state, __ATOMIC_RELAXED) != MCGO_UNLOADED) return;
    __atomic_store_n(&mcgo_state, MCGO_LOADING, __ATOMIC_RELAXED);
    if (!atfork_registered) {
        if (pthread_atfork(NULL, NULL, after_fork) != 0) {
            broken("libmooncake: pthread_atfork failed");
            return;
        }
        atfork_registered = 1;
    }
    char path[PATH_MAX], found[PATH_MAX];
    void *lib = NULL;
    if (loaded_path(path)) {
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    } else {
        if (!go_library_path(path, sizeof path)) return;
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        /* Its runtime started with the load; what matters now is that it
         * is never called unless it is of this build (the exports' C
         * signatures are this build's). */
        if (lib != NULL && !loaded_path(found)) {
            broken("libmooncake: %s is not the Go library this libmooncake.so was built with (another build ID): "
                   "install the two files of one build together",
                   path);
            return;
        }
    }
    if (lib == NULL) {
        broken("libmooncake: cannot load its Go library: %s", dlerror());
        return;
    }
    pid_t (*loaded_pid)(void);
    *(void **)&loaded_pid = dlsym(lib, "mcgo_loaded_pid");
    if (loaded_pid == NULL) {
        broken("libmooncake: %s has no mcgo_loaded_pid: not the Go library of this libmooncake.so", path);
        return;
    }
    /* Loaded already, in the process this one forked from (by another copy
     * of libmooncake.so, which then forked). */
    if (loaded_pid() != getpid()) {
        runtime_pid = loaded_pid();
        broken_by_fork(runtime_pid);
        return;
    }
    runtime_pid = getpid();
    for (const mcgo_symbol_t *s = mcgo_symbols; s->name != NULL; s++) {
        *s->slot = dlsym(lib, s->name);
        if (*s->slot == NULL) {
            broken("libmooncake: %s has no %s: it is not the Go library of this libmooncake.so (install the "
                   "two files of one build together)",
                   path, s->name);
            return;
        }
    }
    __atomic_store_n(&mcgo_state, MCGO_READY, __ATOMIC_RELEASE);
}

int mcgo_load(void) {
    pthread_once(&once, load);
    return __atomic_load_n(&mcgo_state, __ATOMIC_ACQUIRE) == MCGO_READY;
}

mc_status_t mcgo_fail(mc_error_t *err) {
    if (err != NULL) {
        err->code = MC_ERR_PANIC;
        err->domain = MC_DOMAIN_ABI;
        snprintf(err->message, sizeof err->message, "%s", why);
    }
    return MC_ERR_PANIC;
}

void mcgo_complain(void) {
    if (__atomic_exchange_n(&complained, 1, __ATOMIC_RELAXED)) return;
    char line[sizeof why + 64];
    int n = snprintf(line, sizeof line, "%s (every call that needs it fails)\n", why);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    /* write(2), not stdio: this may run in the child of a threaded fork. */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
