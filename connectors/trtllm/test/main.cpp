// The C++ SDK's test suite: GoogleTest, built against an installed tree
// (find_package(mooncake CONFIG)). Run as "--peer MODE" it is the remote
// side of the two-process tests (peer.hpp).
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

#include "peer.hpp"

int main(int argc, char **argv) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 2;
    exe[n] = '\0';
    mctest::self_exe = exe;
    if (argc == 3 && std::strcmp(argv[1], "--peer") == 0) return mctest::peer_main(argv[2]);
    testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
