/* stderr logging.  The level comes from ps_log_set_level() or, if never
 * set, from PS_LOG_LEVEL in the environment (default info). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static char g_task[64] = "-";
static int g_level = -1;

void ps_log_set_task(const char *task) {
  snprintf(g_task, sizeof g_task, "%s", task ? task : "-");
}

void ps_log_set_level(ps_log_level level) { g_level = (int)level; }

int ps_log_level_parse(const char *s) {
  if (s == NULL) return -1;
  if (!strcasecmp(s, "debug")) return PS_LOG_DEBUG;
  if (!strcasecmp(s, "info")) return PS_LOG_INFO;
  if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning")) return PS_LOG_WARN;
  if (!strcasecmp(s, "error")) return PS_LOG_ERROR;
  return -1;
}

static int current_level(void) {
  if (g_level < 0) {
    int l = ps_log_level_parse(getenv("PS_LOG_LEVEL"));
    g_level = l < 0 ? PS_LOG_INFO : l;
  }
  return g_level;
}

void ps_log(ps_log_level level, const char *fmt, ...) {
  if ((int)level < current_level()) return;
  static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  char line[2048];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  localtime_r(&ts.tv_sec, &tm);
  int n = (int)strftime(line, sizeof line, "%Y-%m-%d %H:%M:%S", &tm);
  n += snprintf(line + n, sizeof line - (size_t)n, ".%03ld %s %s: ",
                ts.tv_nsec / 1000000, names[level & 3], g_task);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0;
  n += m;
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
