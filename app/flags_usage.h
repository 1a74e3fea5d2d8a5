// Command-line parsing for the shardtrain binaries with a --help that works.
//
// Abseil's default --help lists only flags defined in "<binary name>.cc",
// which matches none of ours (ps-server's flags live in server/main.cc), so
// it printed "No flags matched" and exited 1. ParseFlags lists every flag the
// binary links that Abseil itself does not define (its main file and shared
// flag files such as app/client_security_flags.cc), and exits 0 after
// --help, --helpshort, --helpfull, --helpon or --helpmatch.
#ifndef SHARDTRAIN_APP_FLAGS_USAGE_H_
#define SHARDTRAIN_APP_FLAGS_USAGE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace shardtrain::app {

// Sets the usage message and which flags help lists. Call before parsing.
void SetUpFlagsUsage(absl::string_view usage);

// SetUpFlagsUsage(usage), then parses like absl::ParseCommandLine (unknown
// flags and bad values exit 1 with a message); a help flag prints the help
// to stdout and exits 0. Returns the positional arguments, argv[0] first.
std::vector<char*> ParseFlags(int argc, char** argv, absl::string_view usage);

// Whether help lists the flags defined in `filename` (a flag's source file as
// Abseil records it): true for every file that is not part of Abseil.
bool IsOwnFlagFile(absl::string_view filename);

// How help names a flag file: "server/main.cc" for "../../server/main.cc"
// or "/src/shardtrain/server/main.cc"; Abseil's from "absl/" on.
std::string ShortFlagFileName(absl::string_view filename);

}  // namespace shardtrain::app

#endif  // SHARDTRAIN_APP_FLAGS_USAGE_H_
