/* stderr logging.  The level comes from ps_log_set_level() or, if never
 * set, from PS_LOG_LEVEL in the environment (default info).  Control
 * characters in a message (a variable name or checkpoint prefix sent by a
 * client may hold a newline) are escaped, so one message is one line. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static char g_task[64] = "-";
/* -1 until set or read from PS_LOG_LEVEL; atomic: any thread logs */
static atomic_int g_level = -1;

void ps_log_set_task(const char *task) {
  if (task == NULL) task = "-";
  ps_log_escape(g_task, sizeof g_task, task, strlen(task));
}

void ps_log_set_level(ps_log_level level) {
  atomic_store(&g_level, (int)level);
}

int ps_log_level_parse(const char *s) {
  if (s == NULL) return -1;
  if (!strcasecmp(s, "debug")) return PS_LOG_DEBUG;
  if (!strcasecmp(s, "info")) return PS_LOG_INFO;
  if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning")) return PS_LOG_WARN;
  if (!strcasecmp(s, "error")) return PS_LOG_ERROR;
  return -1;
}

int ps_log_level_option(const char *prog, const char *arg) {
  int l = ps_log_level_parse(arg);
  if (l < 0) {
    fprintf(stderr, "%s: unknown --log-level '%s'\n", prog, arg);
    return -1;
  }
  ps_log_set_level((ps_log_level)l);
  return 0;
}

static int current_level(void) {
  int cur = atomic_load(&g_level);
  if (cur < 0) { /* racing first readers all compute the same value */
    int l = ps_log_level_parse(getenv("PS_LOG_LEVEL"));
    int want = l < 0 ? PS_LOG_INFO : l;
    if (atomic_compare_exchange_strong(&g_level, &cur, want)) cur = want;
  }
  return cur;
}

size_t ps_log_escape(char *dst, size_t n, const char *src, size_t len) {
  static const char hex[] = "0123456789abcdef";
  size_t k = 0;
  if (n == 0) return 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)src[i];
    char esc[4];
    size_t m = 0;
    if (ch >= 0x20 && ch != 0x7f) {
      esc[m++] = (char)ch;
    } else {
      esc[m++] = '\\';
      switch (ch) {
      case '\n':
        esc[m++] = 'n';
        break;
      case '\r':
        esc[m++] = 'r';
        break;
      case '\t':
        esc[m++] = 't';
        break;
      default:
        esc[m++] = 'x';
        esc[m++] = hex[ch >> 4];
        esc[m++] = hex[ch & 15];
      }
    }
    if (k + m >= n) break;
    memcpy(dst + k, esc, m);
    k += m;
  }
  dst[k] = '\0';
  return k;
}

void ps_log(ps_log_level level, const char *fmt, ...) {
  if ((int)level < current_level()) return;
  static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  char msg[2048], line[4096];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  localtime_r(&ts.tv_sec, &tm);
  int n = (int)strftime(line, sizeof line, "%Y-%m-%d %H:%M:%S", &tm);
  n += snprintf(line + n, sizeof line - (size_t)n, ".%03ld %s %s: ", ts.tv_nsec / 1000000,
                names[level & 3], g_task);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0;
  if (m > (int)sizeof msg - 1) m = (int)sizeof msg - 1;
  /* Names and texts from clients end up here: one message, one line. */
  n += (int)ps_log_escape(line + n, sizeof line - (size_t)n - 1, msg, (size_t)m);
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
