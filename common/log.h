/* Logging to stderr with a level and the task name:
 *   2026-11-22 10:00:00.123 INFO ps/0: listening on 127.0.0.1:2222
 * Thread-safe: each line is written with one write(2).  Control characters
 * in the message are written escaped (\n, \t, \r, \xHH), so text from
 * outside cannot split or forge a line. */
#ifndef PS_LOG_H
#define PS_LOG_H

#include <stddef.h>

typedef enum ps_log_level {
  PS_LOG_DEBUG = 0,
  PS_LOG_INFO = 1,
  PS_LOG_WARN = 2,
  PS_LOG_ERROR = 3,
} ps_log_level;

/* Sets the task name printed on every line ("ps/0"); copied. */
void ps_log_set_task(const char *task);
void ps_log_set_level(ps_log_level level);
/* Parses "debug", "info", "warn", "error"; returns -1 if unknown. */
int ps_log_level_parse(const char *s);
/* A program's --log-level @arg: sets the level, or prints
 * "PROG: unknown --log-level 'ARG'" to stderr and returns -1. */
int ps_log_level_option(const char *prog, const char *arg);
/* A program's --log-format @arg: "text" (above) or "json" (one object a
 * line: {"time":"2026-11-22T10:00:00.123Z","level":"info","task":"ps/0",
 * "msg":"..."}, UTC, valid UTF-8 with control characters escaped), or
 * prints "PROG: unknown --log-format 'ARG'" and returns -1.  Without it,
 * PS_LOG_FORMAT=json in the environment selects JSON. */
int ps_log_format_option(const char *prog, const char *arg);
/* Copies @len bytes of @src to @dst (size @n, NUL-terminated, truncated
 * at a whole character) with control characters escaped as above; returns
 * the length written. */
size_t ps_log_escape(char *dst, size_t n, const char *src, size_t len);
void ps_log(ps_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define PS_DEBUG(...) ps_log(PS_LOG_DEBUG, __VA_ARGS__)
#define PS_INFO(...) ps_log(PS_LOG_INFO, __VA_ARGS__)
#define PS_WARN(...) ps_log(PS_LOG_WARN, __VA_ARGS__)
#define PS_ERROR(...) ps_log(PS_LOG_ERROR, __VA_ARGS__)

#endif
