// Placeholder until this command lands.
#include "base/error.h"
#include "cli/commands.h"

namespace ellm {
int cmd_render(int, char** argv) { throw Error(std::string(argv[0]) + ": not implemented yet"); }
}  // namespace ellm
