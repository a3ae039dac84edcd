// The one-shot floor: the kernel work of one `airlock exec -- /bin/true`, done by the
// smallest program that can do it, so that a one-shot run can be set against what no
// design of it could go below. No policy, no checks beyond each call's error, no result
// record: cgroup v1 memory and pids directories beneath this process's own, with limits,
// joined by the worker itself; clone3 into fresh user, mount, pid, network, IPC, UTS and
// cgroup namespaces; the id maps; a tmpfs root with /usr, the usual symlinks,
// /etc/ld.so.cache, /tmp, /proc and /dev; pivot_root; the bounding set dropped;
// no_new_privs; a Landlock ruleset; a seccomp filter of about a real profile's size; the
// tool forked and exec'd and waited for; the worker reaped; the cgroups removed.
//
// Usage: oneshot-floor [CLSN [COMMAND...]]   C: no cgroups, L: no Landlock, S: no seccomp,
// N: the worker's network namespace made ahead on a second thread while the cgroups are
// made (as airlock's one-shot run does) rather than by the clone; COMMAND instead of
// /bin/true, to look inside (oneshot-floor "" /bin/sh -c 'ls /').
// Run by measure/oneshot-floor (a round-robin against bwrap and airlock). Needs root.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { FAILED = 99 };

static int use_cgroups = 1, use_landlock = 1, use_seccomp = 1, network_ahead = 0;
static char memory_dir[512], pids_dir[512];
static int memory_tasks = -1, pids_tasks = -1;
static int go[2];
static char **command;

static void fail(const char *what) {
  fprintf(stderr, "oneshot-floor: %s: %s\n", what, strerror(errno));
  _exit(FAILED);
}

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -1;
}

static void bind_into(const char *source, const char *target, unsigned long flags) {
  if (mount(source, target, NULL, MS_BIND, NULL)) fail(target);
  if (flags && mount(NULL, target, NULL, MS_BIND | MS_REMOUNT | flags, NULL)) fail(target);
}

static void touch(const char *path) {
  int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) fail(path);
  close(fd);
}

static void build_root(void) {
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) fail("make / private");
  // Any directory will do as the mount point in this private namespace.
  if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1048576,mode=755"))
    fail("root tmpfs");
  if (chdir("/tmp")) fail("chdir root");
  const unsigned long ro = MS_RDONLY | MS_NOSUID | MS_NODEV;
  if (mkdir("usr", 0755)) fail("mkdir usr");
  bind_into("/usr", "usr", ro);
  const char *links[][2] = {
      {"usr/bin", "bin"}, {"usr/sbin", "sbin"}, {"usr/lib", "lib"}, {"usr/lib64", "lib64"}};
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
    if (symlink(links[i][0], links[i][1])) fail(links[i][1]);
  if (mkdir("tmp", 0755)) fail("mkdir tmp");
  if (mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=16777216,mode=1777"))
    fail("tmp");
  if (mkdir("etc", 0755)) fail("mkdir etc");
  touch("etc/ld.so.cache");
  bind_into("/etc/ld.so.cache", "etc/ld.so.cache", ro);
  if (mkdir("proc", 0555)) fail("mkdir proc");
  if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) fail("proc");
  if (mkdir("dev", 0755)) fail("mkdir dev");
  if (mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")) fail("dev");
  const char *devices[] = {"null", "zero", "full", "random", "urandom"};
  for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
    char source[64], target[64];
    snprintf(source, sizeof source, "/dev/%s", devices[i]);
    snprintf(target, sizeof target, "dev/%s", devices[i]);
    touch(target);
    bind_into(source, target, 0);
  }
  const char *dev_links[][2] = {{"/proc/self/fd", "dev/fd"},
                                {"/proc/self/fd/0", "dev/stdin"},
                                {"/proc/self/fd/1", "dev/stdout"},
                                {"/proc/self/fd/2", "dev/stderr"}};
  for (size_t i = 0; i < sizeof dev_links / sizeof dev_links[0]; i++)
    if (symlink(dev_links[i][0], dev_links[i][1])) fail(dev_links[i][1]);
  if (mount(NULL, ".", NULL, MS_BIND | MS_REMOUNT | ro, NULL)) fail("root read-only");
  if (syscall(SYS_pivot_root, ".", ".")) fail("pivot_root");
  if (umount2(".", MNT_DETACH)) fail("detach the old root");
  if (chdir("/")) fail("chdir /");
}

static void restrict_files(void) {
  struct landlock_ruleset_attr attr = {.handled_access_fs = (1ULL << 16) - 1};
  int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
  if (ruleset < 0) fail("landlock_create_ruleset");
  const char *paths[] = {"/usr", "/etc/ld.so.cache", "/tmp", "/dev", "/proc"};
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    uint64_t access = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE;
    if (i != 1) access |= LANDLOCK_ACCESS_FS_READ_DIR;  // not on a file
    struct landlock_path_beneath_attr rule = {.allowed_access = access,
                                              .parent_fd = open(paths[i], O_PATH | O_CLOEXEC)};
    if (rule.parent_fd < 0) fail(paths[i]);
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0))
      fail("landlock_add_rule");
    close(rule.parent_fd);
  }
  if (syscall(SYS_landlock_restrict_self, ruleset, 0)) fail("landlock_restrict_self");
  close(ruleset);
}

static void filter_syscalls(void) {
  // 120 numbers compared one by one: a filter of about a real profile's length. What it
  // allows does not matter here, so everything ends allowed.
  enum { NUMBERS = 120 };
  struct sock_filter code[4 + 2 * NUMBERS + 1];
  size_t n = 0;
  code[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                           offsetof(struct seccomp_data, arch));
  code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xc000003e, 1, 0);
  code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  code[n++] =
      (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  for (unsigned nr = 0; nr < NUMBERS; nr++) {
    code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1);
    code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  }
  code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  struct sock_fprog program = {.len = (unsigned short)n, .filter = code};
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program)) fail("seccomp");
}

// The worker: pid 1 of its namespace.
static void worker(void) {
  // One thread moved, so no threadgroup lock (and its RCU wait) is taken.
  if (memory_tasks >= 0 &&
      (write(memory_tasks, "0", 1) != 1 || write(pids_tasks, "0", 1) != 1))
    fail("join the cgroups");
  char byte;
  if (read(go[0], &byte, 1) != 1) fail("wait for the id maps");
  if (setresgid(0, 0, 0) || setresuid(0, 0, 0)) fail("become root in the namespace");
  build_root();
  if (sethostname("airlock", 7)) fail("sethostname");
  for (int cap = 0; cap <= 40; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail("no_new_privs");
  if (use_landlock) restrict_files();
  if (use_seccomp) filter_syscalls();
  pid_t tool = fork();
  if (tool < 0) fail("fork");
  if (tool == 0) {
    char *true_argv[] = {"/bin/true", NULL};
    char **argv = command ? command : true_argv;
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    execve(argv[0], argv, envp);
    _exit(127);
  }
  int status = 0;
  while (waitpid(tool, &status, 0) < 0)
    if (errno != EINTR) fail("wait for the tool");
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : FAILED);
}

// This process's cgroup in one v1 hierarchy, from /proc/self/cgroup ("/" if not found).
static void own_cgroup(const char *controller, char *out, size_t size) {
  snprintf(out, size, "/");
  FILE *file = fopen("/proc/self/cgroup", "re");
  char line[512];
  while (file && fgets(line, sizeof line, file)) {
    line[strcspn(line, "\n")] = 0;
    char *first = strchr(line, ':');
    char *second = first ? strchr(first + 1, ':') : NULL;
    if (!second) continue;
    *second = 0;
    if (!strcmp(first + 1, controller)) snprintf(out, size, "%s", second + 1);
  }
  if (file) fclose(file);
}

static void remove_cgroups(void) {
  if (memory_dir[0]) rmdir(memory_dir);
  if (pids_dir[0]) rmdir(pids_dir);
}

static void make_cgroups(void) {
  char memory_own[256], pids_own[256], path[600];
  own_cgroup("memory", memory_own, sizeof memory_own);
  own_cgroup("pids", pids_own, sizeof pids_own);
  snprintf(memory_dir, sizeof memory_dir, "/sys/fs/cgroup/memory%s/oneshot-floor-%d",
           memory_own, getpid());
  snprintf(pids_dir, sizeof pids_dir, "/sys/fs/cgroup/pids%s/oneshot-floor-%d", pids_own,
           getpid());
  if (mkdir(memory_dir, 0755)) {
    memory_dir[0] = 0;
    fail("mkdir the memory cgroup (cgroup v1 only; C leaves cgroups out)");
  }
  if (mkdir(pids_dir, 0755)) {
    pids_dir[0] = 0;
    remove_cgroups();
    fail("mkdir the pids cgroup");
  }
  snprintf(path, sizeof path, "%s/memory.limit_in_bytes", memory_dir);
  int limits = write_file(path, "268435456");
  snprintf(path, sizeof path, "%s/pids.max", pids_dir);
  limits |= write_file(path, "64");
  snprintf(path, sizeof path, "%s/tasks", memory_dir);
  memory_tasks = open(path, O_WRONLY | O_CLOEXEC);
  snprintf(path, sizeof path, "%s/tasks", pids_dir);
  pids_tasks = open(path, O_WRONLY | O_CLOEXEC);
  if (limits || memory_tasks < 0 || pids_tasks < 0) {
    remove_cgroups();
    fail("set up the cgroups");
  }
}

// On its own thread: a fresh network namespace, kept by a descriptor.
static void *make_network(void *unused) {
  (void)unused;
  if (unshare(CLONE_NEWNET)) return (void *)-1;
  return (void *)(intptr_t)open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
}

int main(int argc, char **argv) {
  if (argc > 1) {
    use_cgroups = !strchr(argv[1], 'C');
    use_landlock = !strchr(argv[1], 'L');
    use_seccomp = !strchr(argv[1], 'S');
    network_ahead = strchr(argv[1], 'N') != NULL;
  }
  if (argc > 2) command = argv + 2;
  pthread_t maker;
  int home = -1;
  if (network_ahead) {
    home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0 || pthread_create(&maker, NULL, make_network, NULL)) fail("network thread");
  }
  if (use_cgroups) make_cgroups();
  if (pipe2(go, O_CLOEXEC)) fail("pipe");
  int pidfd = -1;
  struct clone_args args = {
      .flags = CLONE_PIDFD | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC |
               CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET,
      .pidfd = (uint64_t)(uintptr_t)&pidfd,
      .exit_signal = SIGCHLD,
  };
  if (network_ahead) {
    // The clone inherits the namespace this thread is in: enter the one made ahead.
    void *made = NULL;
    if (pthread_join(maker, &made) || (intptr_t)made < 0 ||
        setns((int)(intptr_t)made, CLONE_NEWNET)) {
      remove_cgroups();
      fail("enter the network namespace made ahead");
    }
    close((int)(intptr_t)made);
    args.flags &= ~(uint64_t)CLONE_NEWNET;
  }
  long pid = syscall(SYS_clone3, &args, sizeof args);
  if (pid > 0 && network_ahead && setns(home, CLONE_NEWNET)) {
    kill((pid_t)pid, SIGKILL);
    waitpid((pid_t)pid, NULL, 0);
    remove_cgroups();
    fail("return to this process's network namespace");
  }
  if (pid < 0) {
    remove_cgroups();
    fail("clone3");
  }
  if (pid == 0) worker();
  char path[64];
  int maps = 0;
  snprintf(path, sizeof path, "/proc/%ld/uid_map", pid);
  maps |= write_file(path, "0 65534 1");
  snprintf(path, sizeof path, "/proc/%ld/setgroups", pid);
  maps |= write_file(path, "deny");
  snprintf(path, sizeof path, "/proc/%ld/gid_map", pid);
  maps |= write_file(path, "0 65534 1");
  if (maps) kill((pid_t)pid, SIGKILL);
  else if (write(go[1], "x", 1) != 1) kill((pid_t)pid, SIGKILL);
  int status = 0;
  while (waitpid((pid_t)pid, &status, 0) < 0)
    if (errno != EINTR) break;
  remove_cgroups();
  return WIFEXITED(status) ? WEXITSTATUS(status) : FAILED;
}
