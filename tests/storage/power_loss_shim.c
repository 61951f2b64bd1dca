// An LD_PRELOAD shim for power_loss_test.sh: what a disk would still hold
// after a power loss. Each fsync/fdatasync of a regular file directly in
// $POWER_LOSS_DIR (after the real one) copies the file's contents as they
// are then to $POWER_LOSS_DIR.synced/NAME; the test, after a SIGKILL,
// replaces every file with its last synced copy (or removes a file never
// synced): every write not yet synced is gone, as the page cache is at a
// power loss. Built by the test with the system's C compiler.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

// Copies `path` to `to` through a temporary file and a rename.
static void copy_file(const char* path, const char* to) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", to);
  int in = open(path, O_RDONLY | O_CLOEXEC);
  if (in < 0) return;
  int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out >= 0) {
    char buffer[1 << 16];
    ssize_t n;
    int ok = 1;
    while ((n = read(in, buffer, sizeof buffer)) > 0) {
      if (write(out, buffer, (size_t)n) != n) ok = 0;
    }
    close(out);
    if (ok && n == 0) rename(tmp, to); else unlink(tmp);
  }
  close(in);
}

static void snapshot(int fd) {
  const char* dir = getenv("POWER_LOSS_DIR");
  struct stat st;
  if (dir == NULL || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return;
  path[n] = '\0';
  size_t len = strlen(dir);
  if (strncmp(path, dir, len) != 0 || path[len] != '/' ||
      strchr(path + len + 1, '/') != NULL) {
    return;
  }
  char to[PATH_MAX];
  snprintf(to, sizeof to, "%s.synced/%s", dir, path + len + 1);
  pthread_mutex_lock(&lock);
  copy_file(path, to);
  pthread_mutex_unlock(&lock);
}

int fsync(int fd) {
  static int (*real)(int);
  if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  int result = real(fd);
  if (result == 0) snapshot(fd);
  return result;
}

int fdatasync(int fd) {
  static int (*real)(int);
  if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  int result = real(fd);
  if (result == 0) snapshot(fd);
  return result;
}
