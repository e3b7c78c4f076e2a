/* File reads and writes every module shares: one whole-file read, one
 * write loop, one directory fsync, one durable replace.  Each returns 0 or
 * an errno (map it with
 * ps_status_code_from_errno, common/status.h); none logs. */
#ifndef PS_FILEIO_H
#define PS_FILEIO_H

#include <stdbool.h>
#include <stddef.h>

/* Flags of ps_read_file. */
enum {
  /* regular files only, as ps_open_regular opens them: the open never
   * blocks, a directory is EISDIR, a FIFO, device or socket EINVAL with
   * *@type its S_IFMT type */
  PS_READ_REGULAR = 1,
  /* a link at the file itself is not followed (ELOOP) */
  PS_READ_NOFOLLOW = 2,
};

/* Reads the whole of the file @path (relative to @dirfd, or AT_FDCWD), at
 * most @max bytes, into *@out (malloc'd, *@n bytes and a NUL after them).
 * 0, or an errno: EFBIG when the file holds more than @max bytes (*@n is
 * then its size as far as it was seen, above @max), ENOMEM, or the open's
 * or a read's error.  *@op (may be NULL) names the step that failed:
 * "opening" or "reading"; *@type (may be NULL) is 0 but for a file that
 * PS_READ_REGULAR refused.  On failure *@out is NULL. */
int ps_read_file(int dirfd, const char *path, int flags, size_t max, char **out,
                 size_t *n, unsigned *type, const char **op);

/* Writes all @n bytes of @p to @fd, retrying short writes and EINTR. */
int ps_write_all(int fd, const void *p, size_t n);

/* Makes the renames in @dir ("" is ".") durable.  File systems that cannot
 * fsync a directory (EINVAL, EROFS) count as success. */
int ps_fsync_dir(const char *dir);

/* The directory part of @path: "." if none, "/" for "/x"; malloc'd, NULL
 * when out of memory. */
char *ps_dir_of(const char *path);

/* Creates @tmp (O_EXCL, mode 0644), writes @p to it and fsyncs it.  On failure the
 * file is removed and *@op (if not NULL) names the step: "creating",
 * "writing", "syncing", "closing". */
int ps_write_file(const char *tmp, const void *p, size_t n, const char **op);
/* The same with @tmp relative to the directory @dirfd (or AT_FDCWD), a
 * link at @tmp never followed. */
int ps_write_file_at(int dirfd, const char *tmp, const void *p, size_t n,
                     const char **op);

/* Replaces @path durably: ps_write_file of @tmp (NULL: @path + ".tmp" +
 * 16 random hex digits), rename over @path, fsync of the directory.  A
 * reader sees the old file or the new one, never a torn one.  On failure
 * *@op (if not NULL) names the step that failed (the steps above,
 * "renaming", "syncing the directory of") and no temporary file is left;
 * the temporary name is in *@tmp_used if not NULL (malloc'd, for messages). */
int ps_replace_file(const char *path, const char *tmp, const void *p, size_t n,
                    const char **op, char **tmp_used);

/* ps_replace_file of the file @name (no '/') in the directory @dirfd: the
 * temporary file is created, renamed and removed through @dirfd, and @dirfd
 * is fsync'd, so a link swapped for a component of the directory's path
 * changes nothing.  *@tmp_used is the temporary file's name in it. */
int ps_replace_file_at(int dirfd, const char *name, const void *p, size_t n,
                       const char **op, char **tmp_used);

/* Opens the directory @rel (relative, components separated by '/') under
 * the directory @dirfd component by component with O_NOFOLLOW, so no
 * symbolic link is followed on the way (ELOOP or ENOTDIR if one is) and no
 * ".." is taken (EPERM); with @create, missing components are made (0755).
 * "" opens @dirfd itself again.  A descriptor (O_CLOEXEC), or -1 with errno. */
int ps_open_beneath(int dirfd, const char *rel, bool create);

/* Opens @path (relative to @dirfd, or AT_FDCWD) for reading, as checkpoint
 * files are read: with @nofollow a link at the file itself is not followed
 * (ELOOP); the open never blocks, a directory is EISDIR, and anything
 * else but a regular file (a FIFO that would block every read, a device, a
 * socket) is refused: -1 with errno EINVAL and *@type (may be NULL; 0
 * otherwise) its S_IFMT type.  The
 * descriptor returned is blocking.  -1 with errno on other failures. */
int ps_open_regular(int dirfd, const char *path, bool nofollow, unsigned *type);
/* "a FIFO", "a directory", "a socket", "a device" or "not a regular file":
 * for messages about a @type from ps_open_regular. */
const char *ps_file_type_name(unsigned type);

#endif
