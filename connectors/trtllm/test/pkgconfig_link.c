/* A tiny C program built with nothing but `pkg-config --cflags --libs
 * mooncake` (or transfer_engine): both headers compile as C, the library
 * links, and at run time it loads its Go half from beside itself (an engine
 * through each API). */
#include <stdio.h>

#include "mooncake.h"
#include "transfer_engine_c.h"

int main(void) {
    if ((mc_abi_version() >> 16) != MC_ABI_VERSION_MAJOR) return 1;
    mc_error_t err;
    mc_engine_t e = 0;
    if (mc_engine_create(NULL, &e, &err) != MC_OK) {
        fprintf(stderr, "pkgconfig_link: %s\n", err.message);
        return 2;
    }
    if (mc_engine_destroy(e, &err) != MC_OK) return 3;
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    if (te == NULL) return 4;
    destroyTransferEngine(te);
    puts("pkgconfig_link: ok");
    return 0;
}
