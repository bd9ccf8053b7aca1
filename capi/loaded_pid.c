// The process the Go library was loaded in, which is the process its Go
// runtime started in (the runtime starts when the library loads). The
// loader of libmooncake.so (loader.c) compares it with its own: a library
// found already loaded under another pid came with a fork(), and its
// runtime has no threads in this process.

#include <sys/types.h>
#include <unistd.h>

static pid_t loaded_pid;

__attribute__((constructor)) static void record_loaded_pid(void) { loaded_pid = getpid(); }

// mcgo_loaded_pid is plain C: calling it does not enter the runtime, so it
// answers in a process where the runtime cannot run.
pid_t mcgo_loaded_pid(void) { return loaded_pid; }
