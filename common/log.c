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
/* 0 text, 1 JSON lines; -1 until set or read from PS_LOG_FORMAT */
static atomic_int g_format = -1;
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

int ps_log_format_option(const char *prog, const char *arg) {
  if (arg && !strcmp(arg, "text")) {
    atomic_store(&g_format, 0);
  } else if (arg && !strcmp(arg, "json")) {
    atomic_store(&g_format, 1);
  } else {
    fprintf(stderr, "%s: unknown --log-format '%s' (text or json)\n", prog,
            arg ? arg : "");
    return -1;
  }
  return 0;
}

static int current_format(void) {
  int cur = atomic_load(&g_format);
  if (cur < 0) {
    const char *e = getenv("PS_LOG_FORMAT");
    int want = e && !strcmp(e, "json") ? 1 : 0;
    if (atomic_compare_exchange_strong(&g_format, &cur, want)) cur = want;
  }
  return cur;
}

/* The length of the valid UTF-8 sequence at @s (at most @len bytes), or 0. */
static size_t utf8_len(const unsigned char *s, size_t len) {
  size_t n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
  if (n == 0 || n > len || (s[0] >= 0xf8)) return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (n == 3 && s[0] == 0xe0 && s[1] < 0xa0) return 0;  /* overlong */
  if (n == 3 && s[0] == 0xed && s[1] >= 0xa0) return 0; /* surrogates */
  if (n == 4 && s[0] == 0xf0 && s[1] < 0x90) return 0;
  if (n == 4 && s[0] == 0xf4 && s[1] >= 0x90) return 0;
  return n;
}

/* @src as the inside of a JSON string: quotes, backslashes and control
 * characters escaped, bytes that are not UTF-8 as U+FFFD. */
static size_t json_escape(char *dst, size_t n, const char *src, size_t len) {
  size_t k = 0;
  if (n == 0) return 0;
  for (size_t i = 0; i < len;) {
    const unsigned char *c = (const unsigned char *)src + i;
    char esc[8];
    size_t m = 0, step = 1;
    if (*c == '"' || *c == '\\') {
      esc[m++] = '\\';
      esc[m++] = (char)*c;
    } else if (*c < 0x20 || *c == 0x7f) {
      m = (size_t)snprintf(esc, sizeof esc, "\\u%04x", *c);
    } else if (*c < 0x80) {
      esc[m++] = (char)*c;
    } else if ((step = utf8_len(c, len - i)) > 0) {
      memcpy(esc, c, step);
      m = step;
    } else {
      step = 1;
      memcpy(esc, "\xef\xbf\xbd", 3); /* U+FFFD */
      m = 3;
    }
    if (k + m >= n) break;
    memcpy(dst + k, esc, m);
    k += m;
    i += step;
  }
  dst[k] = '\0';
  return k;
}

/* The task name as the inside of a JSON string. */
static const char *task_json(void) {
  static _Thread_local char buf[200];
  json_escape(buf, sizeof buf, g_task, strlen(g_task));
  return buf;
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
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0;
  if (m > (int)sizeof msg - 1) m = (int)sizeof msg - 1;
  int n;
  if (current_format() == 1) { /* one JSON object a line, UTC time */
    static const char *const lower[] = {"debug", "info", "warn", "error"};
    gmtime_r(&ts.tv_sec, &tm);
    n = (int)strftime(line, sizeof line, "{\"time\":\"%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n,
                  ".%03ldZ\",\"level\":\"%s\",\"task\":\"%s\",\"msg\":\"",
                  ts.tv_nsec / 1000000, lower[level & 3], task_json());
    if (n > (int)sizeof line - 4) n = (int)sizeof line - 4;
    n += (int)json_escape(line + n, sizeof line - (size_t)n - 3, msg, (size_t)m);
    line[n++] = '"';
    line[n++] = '}';
  } else {
    localtime_r(&ts.tv_sec, &tm);
    n = (int)strftime(line, sizeof line, "%Y-%m-%d %H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n,
                  ".%03ld %s %s: ", ts.tv_nsec / 1000000, names[level & 3], g_task);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    /* Names and texts from clients end up here: one message, one line. */
    n += (int)ps_log_escape(line + n, sizeof line - (size_t)n - 1, msg, (size_t)m);
  }
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
