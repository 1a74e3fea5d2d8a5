#include "app/flags_usage.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace shardtrain::app {

bool IsOwnFlagFile(absl::string_view filename) {
  return !absl::StrContains(filename, "absl/");
}

std::string ShortFlagFileName(absl::string_view filename) {
  const size_t absl_dir = filename.rfind("absl/");
  if (absl_dir != absl::string_view::npos) return std::string(filename.substr(absl_dir));
  // The build may name sources "../../server/main.cc" or by an absolute
  // path; "server/main.cc" is what a reader needs.
  const size_t last = filename.rfind('/');
  if (last == absl::string_view::npos || last == 0) return std::string(filename);
  const size_t before = filename.rfind('/', last - 1);
  return std::string(
      before == absl::string_view::npos ? filename : filename.substr(before + 1));
}

void SetUpFlagsUsage(absl::string_view usage) {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = &IsOwnFlagFile;
  config.contains_help_flags = &IsOwnFlagFile;
  config.contains_helppackage_flags = &IsOwnFlagFile;
  config.normalize_filename = &ShortFlagFileName;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
}

std::vector<char*> ParseFlags(int argc, char** argv, absl::string_view usage) {
  SetUpFlagsUsage(usage);
  // absl::ParseCommandLine exits 1 after printing help (Abseil 20220623);
  // parse without the usage handling and handle it here, so that asking for
  // help succeeds.
  namespace fi = absl::flags_internal;
  std::vector<char*> positional = fi::ParseCommandLineImpl(
      argc, argv, fi::ArgvListAction::kRemoveParsedArgs,
      fi::UsageFlagsAction::kIgnoreUsage, fi::OnUndefinedFlag::kAbortIfUndefined);
  const int handled = fi::HandleUsageFlags(std::cout, absl::ProgramUsageMessage());
  if (handled >= 0) {
    std::cout.flush();
    std::exit(0);
  }
  return positional;
}

}  // namespace shardtrain::app
