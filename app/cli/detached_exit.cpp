#include "app/cli/detached_exit.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace gpuphot::cli {
namespace {

volatile sig_atomic_t g_child = 0;

void passOn(int sig) {
    if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

// The child's side: the command (ended by SIGKILL if the parent is, as the process would be), then its
// streams to /dev/null, then its status to the parent, after which it no longer depends on the parent.
int runChild(const std::function<int()>& command, int statusFd, pid_t parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(137); // the parent was killed before the line above
    const int rc = command();
    std::fflush(nullptr);
    const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) {
        for (int fd = 0; fd <= 2; ++fd)
            ::dup2(devnull, fd);
        ::close(devnull);
    }
    ::prctl(PR_SET_PDEATHSIG, 0);
    const auto status = static_cast<unsigned char>(rc);
    ssize_t w = 0;
    do {
        w = ::write(statusFd, &status, 1);
    } while (w < 0 && errno == EINTR);
    ::close(statusFd);
    return rc;
}

// The exit status of a child that ended before handing its status over; a signal is raised here again.
int endedChildStatus(pid_t child) {
    int st = 0;
    while (::waitpid(child, &st, 0) < 0)
        if (errno != EINTR) return 1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) {
        const int sig = WTERMSIG(st);
        std::signal(sig, SIG_DFL);
        std::raise(sig);
        return 128 + sig;
    }
    return 1;
}

} // namespace

int runDetached(const std::function<int()>& command) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return command();
    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        return command();
    }
    if (pid == 0) {
        ::close(fds[0]);
        return runChild(command, fds[1], parent);
    }
    ::close(fds[1]);
    g_child = pid;
    struct sigaction sa = {};
    sa.sa_handler = passOn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
        ::sigaction(sig, &sa, nullptr);
    unsigned char status = 0;
    ssize_t r = 0;
    do {
        r = ::read(fds[0], &status, 1);
    } while (r < 0 && errno == EINTR);
    ::close(fds[0]);
    if (r == 1) return status; // the child goes on releasing the device on its own
    return endedChildStatus(pid);
}

} // namespace gpuphot::cli
