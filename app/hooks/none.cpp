// gpuphot: no fault injection.
#include "app/cli/test_hooks.hpp"

namespace gpuphot::cli {

const CliTestHooks& cliTestHooks() {
    static const CliTestHooks none;
    return none;
}

} // namespace gpuphot::cli
