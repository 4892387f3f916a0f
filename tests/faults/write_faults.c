/* Fault injection for the tests, as SQLite tests its I/O: the k-th write of a process to one target fails.
 *
 * Loaded with LD_PRELOAD into a real training process (or into tests/forkserver.py's server, whose children
 * inherit it). Every write(), writev(), pwrite() and pwrite64() that reaches libc through the dynamic linker is
 * seen: Python's own, and C++'s that call libc directly (stdio's buffered writes inside libc are not). Read from
 * the environment at each call, so that a forked child's settings apply:
 *   AUTOCKPT_FAULT_TARGET  fd:N (that descriptor, while it is still the file it was when armed) or
 *                          path:PREFIX (any descriptor whose path starts with PREFIX); several, separated
 *                          by `;`, count as one target
 *   AUTOCKPT_FAULT_ARM     a file: counting starts once it exists (the test creates it when it signals)
 *   AUTOCKPT_FAULT_AT      k: the k-th matching write after arming fails (0: none fails, only counted)
 *   AUTOCKPT_FAULT_ERRNO   the errno it fails with (EPIPE 32, ENOSPC 28, EIO 5)
 *   AUTOCKPT_FAULT_PERSIST 1: the k-th and every later matching write fail (a dead reader, a full disk)
 *   AUTOCKPT_FAULT_COUNT   a file the shim rewrites with the number of matching writes since arming
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);

static long counted;
static int armed;
#define MAX_FDS 8
static dev_t armed_dev[MAX_FDS];
static ino_t armed_ino[MAX_FDS];

static write_fn real_write(void) {
  static write_fn fn;
  if (!fn) fn = (write_fn)dlsym(RTLD_NEXT, "write");
  return fn;
}

/* One target (`len` characters of `t`) against a write to `fd`. */
static int matches(int fd, const char *t, size_t len) {
  if (len > 3 && strncmp(t, "fd:", 3) == 0) {
    int want = atoi(t + 3);
    struct stat st;
    if (fd != want || fd >= MAX_FDS || fstat(fd, &st) != 0) return 0;
    return !armed || (st.st_dev == armed_dev[fd] && st.st_ino == armed_ino[fd]);  /* replaced (dup2): not it */
  }
  if (len <= 5 || strncmp(t, "path:", 5) != 0) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strlen(path) >= len - 5 && strncmp(path, t + 5, len - 5) == 0;
}

static int is_target(int fd, const char *targets) {
  for (const char *t = targets; *t;) {
    size_t len = strcspn(t, ";");
    if (matches(fd, t, len)) return 1;
    t += len + (t[len] == ';');
  }
  return 0;
}

static int arm(void) {
  const char *arm_file = getenv("AUTOCKPT_FAULT_ARM");
  struct stat st;
  if (armed) return 1;
  if (!arm_file || stat(arm_file, &st) != 0) return 0;
  for (int fd = 0; fd < MAX_FDS; fd++) {
    if (fstat(fd, &st) == 0) {
      armed_dev[fd] = st.st_dev;
      armed_ino[fd] = st.st_ino;
    }
  }
  armed = 1;
  return 1;
}

static void save_count(long n) {
  const char *path = getenv("AUTOCKPT_FAULT_COUNT");
  if (!path) return;
  char text[32];
  int len = snprintf(text, sizeof text, "%ld\n", n);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  real_write()(fd, text, len);
  close(fd);
}

/* 1 when this write must fail (errno set). */
static int fails(int fd) {
  const char *target = getenv("AUTOCKPT_FAULT_TARGET");
  if (!target || !is_target(fd, target) || !arm()) return 0;
  long n = __atomic_add_fetch(&counted, 1, __ATOMIC_SEQ_CST);
  save_count(n);
  const char *at = getenv("AUTOCKPT_FAULT_AT"), *code = getenv("AUTOCKPT_FAULT_ERRNO");
  const char *persist = getenv("AUTOCKPT_FAULT_PERSIST");
  long k = at ? atol(at) : 0;
  if (k <= 0 || n < k || (n > k && !(persist && persist[0] == '1'))) return 0;
  errno = code ? atoi(code) : EIO;
  return 1;
}

ssize_t write(int fd, const void *buf, size_t count) {
  if (fails(fd)) return -1;
  return real_write()(fd, buf, count);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
  static writev_fn fn;
  if (!fn) fn = (writev_fn)dlsym(RTLD_NEXT, "writev");
  if (fails(fd)) return -1;
  return fn(fd, iov, iovcnt);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
  static pwrite_fn fn;
  if (!fn) fn = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
  if (fails(fd)) return -1;
  return fn(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
  static pwrite_fn fn;
  if (!fn) fn = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
  if (fails(fd)) return -1;
  return fn(fd, buf, count, offset);
}
