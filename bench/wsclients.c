/* Many WebSocket subscribers in one process, in C: bench/wsclients.py's loop for a fraction of its CPU.

   Started by bench/ws_fanout.py (compiled at run time with `cc -O2`, see
   bench/wsclientc.py) exactly as it starts `python -m bench.wsclients`:

       wsclients PORT COLLECTION COUNT [--nice N] [--cpus 0,1] [--poll-ms MS]

   Why C: the clients stand for subscribers on other machines, but on the
   benchmark's 2-core machine they share the gateway's CPUs.  The Python
   client spends ~4.3 us per frame (its interpreter around epoll, recvmsg,
   the parse and two histograms): 86-91 % of a core for 200,000 frames/s,
   beside the gateway's 60-63 %, so the gateway waited for a CPU and the
   figure was partly the harness's.  The same work in C is the system
   calls and a few comparisons per frame.

   It is the Python client's twin, not a new design: the same stdin/stdout
   JSON-lines commands (open, reset FIRST, target T, stats, quit; one JSON
   line in reply), the same counts and histograms (BUCKET_NS buckets, as
   {"bucket": count}), the same checks.  Read bench/wsclients.py for the
   reasons; in short:

   - RFC 6455 just enough: the opening handshake (section 4.1, the answer's
     status line must say 101; Sec-WebSocket-Accept is not checked), then
     frame headers (section 5.2; a server's frames are never masked, 5.1).
     A ping (opcode 9) is answered with a masked pong carrying its payload
     (mask 0 is a mask), so the gateway's keepalive runs as in production.
   - A notification frame, the gateway's
     {"type":"notification","collection":C,"seq":N,"prev":P,"format":..,"payload":".."}
     (rsnotify/transport/wsproto.py notification_frame), is read at fixed
     places: seq and prev after the known prefix; a prev that is not the
     last seq accounted for is a *break*.  The send time is the digits after
     "?t=" in the loc (inside the JSON-escaped payload, ended by the \ of \").
   - The first client of the process also reads the gateway's `published`
     stamp (\"published\":\"YYYY-MM-DDThh:mm:ss[.f]Z\", escaped the same
     way; the gateway writes six fraction digits) and splits its latency:
     send -> published (*to_gateway*), published -> arrival (*fan_out*).
   - Rare frames are found by their key: "type":"hello" (then "head":),
     "type":"skipped" (then "from": and "resume":).  The gateway's JSON is
     compact (orjson), and inside a string value every quote is escaped, so
     `"key":` with its quotes unescaped is a key, never text in a value.
   - Arrival: each read is one recvmsg on a socket with SO_TIMESTAMPNS, so
     the kernel's receive time of the read's last bytes comes with them; all
     frames of the read get it (an upper bound for the earlier ones).  A read
     without a timestamp falls back to the read time and is counted
     (unstamped).  *read* is CLOCK_REALTIME when recvmsg returned.

   Latencies past MAX_BUCKETS buckets (10 minutes) are counted in the last
   one.  One epoll loop, level-triggered, one read of READ_BYTES per ready
   socket per round, as the Python loop does.  No library beyond libc. */

#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <fcntl.h>

#define CONNECT_SLOTS 100           /* handshakes in flight */
#define BUCKET_NS 100000            /* latency histograms: 0.1 ms buckets */
#define MAX_BUCKETS 6000000         /* 10 minutes */
#define READ_BYTES (16 * 1024)      /* one read, as bench/wsclients.py */
#define MAX_FAILED 64               /* distinct failure reasons kept */

/* --- small helpers ------------------------------------------------------------------- */

static void die(const char *what) {
    fprintf(stderr, "wsclients: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void *grow(void *p, size_t size) {
    void *q = realloc(p, size);
    if (q == NULL && size) die("realloc");
    return q;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* An optionally signed decimal at p (before end); *after is where its digits end. */
static int64_t parse_int(const char *p, const char *end, const char **after) {
    int negative = p < end && *p == '-';
    int64_t v = 0;
    if (negative) p++;
    while (p < end && *p >= '0' && *p <= '9') v = v * 10 + (*p++ - '0');
    if (after) *after = p;
    return negative ? -v : v;
}

/* The integer after `key` (e.g. "\"head\":") in a compact JSON object; found: 1. */
static int int_after(const char *p, size_t n, const char *key, int64_t *out) {
    size_t k = strlen(key);
    const char *at = memmem(p, n, key, k);
    if (at == NULL) return 0;
    *out = parse_int(at + k, p + n, NULL);
    return 1;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (the civil-from-days inverse). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* YYYY-MM-DDThh:mm:ss[.fraction]Z (UTC, as w3cdt.format writes it) -> ns; -1 if not that. */
static int64_t parse_utc(const char *p, const char *end) {
    static const char shape[] = "dddd-dd-ddTdd:dd:dd";
    if (end - p < 20) return -1;
    for (int i = 0; i < 19; i++) {
        if (shape[i] == 'd' ? (p[i] < '0' || p[i] > '9') : p[i] != shape[i]) return -1;
    }
    int64_t days = days_from_civil(parse_int(p, p + 4, NULL), parse_int(p + 5, p + 7, NULL),
                                   parse_int(p + 8, p + 10, NULL));
    int64_t seconds = days * 86400 + parse_int(p + 11, p + 13, NULL) * 3600 +
                      parse_int(p + 14, p + 16, NULL) * 60 + parse_int(p + 17, p + 19, NULL);
    int64_t fraction = 0, scale = 1000000000;
    p += 19;
    if (p < end && *p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
            if (scale > 1) {
                scale /= 10;
                fraction += (*p - '0') * scale;
            }
        }
    }
    if (p >= end || *p != 'Z') return -1;
    return seconds * 1000000000 + fraction;
}

/* --- output: one JSON line per command ---------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
} Out;

static void out_printf(Out *o, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->data + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        o->cap = o->cap * 2 + (n > 0 ? (size_t)n : 0) + 256;
        o->data = grow(o->data, o->cap);
    }
}

/* A JSON string of (possibly non-UTF-8) bytes: escapes, and '?' for non-ASCII. */
static void out_string(Out *o, const char *s, size_t n) {
    out_printf(o, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') out_printf(o, "\\%c", c);
        else if (c < 0x20) out_printf(o, "\\u%04x", c);
        else out_printf(o, "%c", c >= 0x80 ? '?' : c);
    }
    out_printf(o, "\"");
}

static void reply(Out *o) {
    out_printf(o, "\n");
    for (size_t done = 0; done < o->len;) {
        ssize_t n = write(STDOUT_FILENO, o->data + done, o->len - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("write stdout");
        }
        done += (size_t)n;
    }
    o->len = 0;
}

/* --- histograms ------------------------------------------------------------------------ */

typedef struct {
    uint64_t *n;
    size_t size;
} Histogram;

static void count(Histogram *h, int64_t ns) {
    size_t bucket = ns > 0 ? (size_t)(ns / BUCKET_NS) : 0;
    if (bucket >= MAX_BUCKETS) bucket = MAX_BUCKETS - 1;
    if (bucket >= h->size) {
        size_t size = h->size ? h->size : 4096;
        while (size <= bucket) size *= 2;
        h->n = grow(h->n, size * sizeof *h->n);
        memset(h->n + h->size, 0, (size - h->size) * sizeof *h->n);
        h->size = size;
    }
    h->n[bucket]++;
}

static void out_histogram(Out *o, const char *name, const Histogram *h) {
    const char *sep = "";
    out_printf(o, ", \"%s\": {", name);
    for (size_t b = 0; b < h->size; b++) {
        if (h->n[b]) {
            out_printf(o, "%s\"%zu\": %llu", sep, b, (unsigned long long)h->n[b]);
            sep = ", ";
        }
    }
    out_printf(o, "}");
}

/* --- the pool ------------------------------------------------------------------------------ */

typedef struct {
    int fd;
    int open;           /* the handshake's 101 seen */
    int sampled;        /* the process's first client: splits its latency */
    int64_t last;       /* last seq accounted for (hello.head, then prev/seq/skipped); -1: no hello */
    double reached_at;  /* read time (s) at which last >= target */
    char *pending;      /* bytes of an incomplete frame (or handshake answer) */
    size_t pending_len, pending_cap;
} Client;

static struct {
    int port, epoll;
    char path[1024];
    char prefix[1100];  /* {"type":"notification","collection":C,"seq": */
    size_t prefix_len;
    Client **clients;   /* by fd */
    size_t clients_cap;
    int any_client;     /* one was ever connected: the next is not sampled */
    int64_t target, first;
    int handshaking, opened;
    char *failed[MAX_FAILED];
    int failed_count;
    uint64_t notifications, skipped, breaks, closed, unstamped;
    Histogram histogram, read_histogram, to_gateway, fan_out;
    char *rbuf;         /* pending bytes + one read */
    size_t rbuf_cap;
} pool;

static void note_failure(const char *why, size_t n) {
    if (n > 80) n = 80;
    for (int i = 0; i < pool.failed_count; i++) {
        if (strlen(pool.failed[i]) == n && memcmp(pool.failed[i], why, n) == 0) return;
    }
    if (pool.failed_count == MAX_FAILED) return;
    char *copy = grow(NULL, n + 1);
    memcpy(copy, why, n);
    copy[n] = 0;
    pool.failed[pool.failed_count++] = copy;
}

static void reset(int64_t first) {
    pool.first = first;
    pool.notifications = pool.skipped = pool.breaks = pool.closed = pool.unstamped = 0;
    Histogram *all[] = {&pool.histogram, &pool.read_histogram, &pool.to_gateway, &pool.fan_out};
    for (int i = 0; i < 4; i++) {
        free(all[i]->n);
        all[i]->n = NULL;
        all[i]->size = 0;
    }
}

static void stats(Out *o) {
    int connected = 0, done = 0;
    double done_at = 0;
    for (size_t fd = 0; fd < pool.clients_cap; fd++) {
        Client *c = pool.clients[fd];
        if (c == NULL) continue;
        connected += c->open;
        if (c->reached_at) {
            done++;
            if (c->reached_at > done_at) done_at = c->reached_at;
        }
    }
    out_printf(o, "{\"connected\": %d, \"notifications\": %llu, \"skipped\": %llu, "
               "\"breaks\": %llu, \"closed\": %llu, \"unstamped\": %llu, \"done\": %d, ",
               connected, (unsigned long long)pool.notifications,
               (unsigned long long)pool.skipped, (unsigned long long)pool.breaks,
               (unsigned long long)pool.closed, (unsigned long long)pool.unstamped, done);
    if (done) out_printf(o, "\"done_at\": %.6f", done_at);
    else out_printf(o, "\"done_at\": null");
    out_histogram(o, "histogram", &pool.histogram);
    out_histogram(o, "read_histogram", &pool.read_histogram);
    out_histogram(o, "to_gateway", &pool.to_gateway);
    out_histogram(o, "fan_out", &pool.fan_out);
    out_printf(o, "}");
}

/* --- connections ------------------------------------------------------------------------- */

static void base64(const unsigned char *in, size_t n, char *out) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *out++ = abc[v >> 18];
        *out++ = abc[v >> 12 & 63];
        *out++ = abc[v >> 6 & 63];
        *out++ = abc[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        *out++ = abc[v >> 18];
        *out++ = abc[v >> 12 & 63];
        *out++ = i + 1 < n ? abc[v >> 6 & 63] : '=';
        *out++ = '=';
    }
    *out = 0;
}

/* Open one connection and send its handshake; the loop reads the answer.  0, or -1 (noted). */
static int connect_one(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) goto failed;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)pool.port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&to, sizeof to) < 0) goto failed;
    int on = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) < 0) goto failed;
    unsigned char nonce[16];
    char key[32], request[2048];
    if (getrandom(nonce, sizeof nonce, 0) != sizeof nonce) goto failed;
    base64(nonce, sizeof nonce, key);
    int n = snprintf(request, sizeof request,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n", pool.path, key);
    for (int sent = 0; sent < n;) {  /* still blocking: a small request goes out whole */
        ssize_t k = send(fd, request + sent, (size_t)(n - sent), MSG_NOSIGNAL);
        if (k < 0) goto failed;
        sent += (int)k;
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) goto failed;
    if ((size_t)fd >= pool.clients_cap) {
        size_t cap = pool.clients_cap ? pool.clients_cap : 1024;
        while (cap <= (size_t)fd) cap *= 2;
        pool.clients = grow(pool.clients, cap * sizeof *pool.clients);
        memset(pool.clients + pool.clients_cap, 0, (cap - pool.clients_cap) * sizeof *pool.clients);
        pool.clients_cap = cap;
    }
    Client *c = grow(NULL, sizeof *c);
    *c = (Client){.fd = fd, .last = -1, .sampled = !pool.any_client};
    pool.any_client = 1;
    pool.clients[fd] = c;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(pool.epoll, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
    pool.handshaking++;
    return 0;
failed:;
    const char *why = strerror(errno);
    note_failure(why, strlen(why));
    if (fd >= 0) close(fd);
    return -1;
}

static void lost(Client *c, const char *why, size_t n) {
    epoll_ctl(pool.epoll, EPOLL_CTL_DEL, c->fd, NULL);
    pool.clients[c->fd] = NULL;
    close(c->fd);
    pool.closed++;
    if (c->last < 0) {  /* no hello yet */
        pool.handshaking--;
        note_failure(why, n);
    }
    free(c->pending);
    free(c);
}

/* --- reading --------------------------------------------------------------------------------- */

static const char T_MARK[] = "?t=";
static const char PUBLISHED[] = "published\\\":\\\"";  /* published\":\" in the escaped payload */

static void text(Client *c, const char *p, size_t n, int64_t arrival_ns, int64_t read_ns) {
    const char *end = p + n;
    if (n > pool.prefix_len && memcmp(p, pool.prefix, pool.prefix_len) == 0) {
        const char *q;
        int64_t seq = parse_int(p + pool.prefix_len, end, &q);
        int64_t prev = parse_int(q + 8 < end ? q + 8 : end, end, NULL);  /* ,"prev": */
        if (prev != c->last) pool.breaks++;
        c->last = seq;
        if (seq >= pool.first) {
            pool.notifications++;
            const char *mark = memmem(q, (size_t)(end - q), T_MARK, sizeof T_MARK - 1);
            if (mark != NULL) {
                int64_t sent = parse_int(mark + 3, end, NULL);
                count(&pool.histogram, arrival_ns - sent);
                count(&pool.read_histogram, read_ns - sent);
                if (c->sampled) {
                    const char *stamp = memmem(q, (size_t)(end - q), PUBLISHED, sizeof PUBLISHED - 1);
                    int64_t published_ns =
                        stamp ? parse_utc(stamp + sizeof PUBLISHED - 1, end) : -1;
                    if (published_ns >= 0) {
                        count(&pool.to_gateway, published_ns - sent);
                        count(&pool.fan_out, arrival_ns - published_ns);
                    }
                }
            }
        }
    } else if (memmem(p, n, "\"type\":\"skipped\"", 16)) {
        int64_t from, resume;
        if (int_after(p, n, "\"from\":", &from) && int_after(p, n, "\"resume\":", &resume)) {
            pool.skipped += (uint64_t)(resume - from);
            c->last = resume - 1;
        }
    } else if (c->last < 0 && memmem(p, n, "\"type\":\"hello\"", 14)) {
        int64_t head;
        if (int_after(p, n, "\"head\":", &head)) {
            c->last = head;
            pool.handshaking--;
            pool.opened++;
        }
    }  /* heartbeat and the rest: nothing to count */
    if (pool.target && c->last >= pool.target && !c->reached_at) c->reached_at = read_ns / 1e9;
}

static void readable(Client *c) {
    if (pool.rbuf_cap < c->pending_len + READ_BYTES) {
        pool.rbuf_cap = c->pending_len + READ_BYTES;
        pool.rbuf = grow(pool.rbuf, pool.rbuf_cap);
    }
    if (c->pending_len) memcpy(pool.rbuf, c->pending, c->pending_len);
    char control[CMSG_SPACE(sizeof(struct timespec))];
    struct iovec iov = {.iov_base = pool.rbuf + c->pending_len, .iov_len = READ_BYTES};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = control, .msg_controllen = sizeof control};
    ssize_t got = recvmsg(c->fd, &msg, 0);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        const char *why = strerror(errno);
        lost(c, why, strlen(why));
        return;
    }
    int64_t read_ns = now_ns();  /* before any parsing: the process's own delay ends here */
    if (got == 0) {
        lost(c, "closed by the gateway", 21);
        return;
    }
    int64_t arrival_ns = read_ns;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
        struct timespec ts;
        memcpy(&ts, CMSG_DATA(cm), sizeof ts);
        arrival_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    } else {
        pool.unstamped++;
    }
    const unsigned char *buf = (const unsigned char *)pool.rbuf;
    size_t size = c->pending_len + (size_t)got, pos = 0;
    if (!c->open) {
        const char *head_end = memmem(buf, size, "\r\n\r\n", 4);
        const char *line_end = memmem(buf, size, "\r\n", 2);
        if (head_end == NULL) {
            pos = size;  /* keep it all */
            goto keep;
        }
        if (!memmem(buf, (size_t)(line_end - (const char *)buf), " 101 ", 5)) {
            lost(c, (const char *)buf, size);
            return;
        }
        c->open = 1;
        pos = (size_t)(head_end + 4 - (const char *)buf);
    }
    while (size - pos >= 2) {
        uint64_t length = buf[pos + 1] & 0x7F;
        size_t head = 2;
        if (buf[pos + 1] & 0x80) {  /* a masked frame from a server: RFC 6455 5.1 says close */
            lost(c, "masked frame from the gateway", 29);
            return;
        }
        if (length == 126) {
            if (size - pos < 4) break;
            length = (uint64_t)buf[pos + 2] << 8 | buf[pos + 3];
            head = 4;
        } else if (length == 127) {
            if (size - pos < 10) break;
            length = 0;
            for (int i = 2; i < 10; i++) length = length << 8 | buf[pos + i];
            head = 10;
        }
        if (size - pos < head + length) break;
        int opcode = buf[pos] & 0x0F;
        const char *payload = (const char *)buf + pos + head;
        pos += head + length;
        if (opcode == 1) {
            text(c, payload, (size_t)length, arrival_ns, read_ns);
        } else if (opcode == 9 && length <= 125) {  /* ping: a masked pong, same payload */
            unsigned char pong[6 + 125] = {0x8A, (unsigned char)(0x80 | length), 0, 0, 0, 0};
            memcpy(pong + 6, payload, (size_t)length);
            send(c->fd, pong, 6 + (size_t)length, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
    }
    if (pos == size) {
        c->pending_len = 0;
        return;
    }
    pos = size - pos;  /* from here: how many bytes to keep, at the end of buf */
keep:
    if (c->pending_cap < pos) {
        c->pending_cap = pos;
        c->pending = grow(c->pending, pos);
    }
    memmove(c->pending, buf + size - pos, pos);
    c->pending_len = pos;
}

/* --- the loop ----------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: wsclients PORT COLLECTION COUNT [--nice N] [--cpus 0,1] [--poll-ms MS]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *positional[3];
    int npos = 0, nice_by = 0;
    const char *cpus = NULL;
    double poll_ms = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = NULL;
        if (strncmp(arg, "--", 2) != 0) {
            if (npos == 3) usage();
            positional[npos++] = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (eq) value = eq + 1;
        else if (i + 1 < argc) value = argv[++i];
        else usage();
        if (name_len == 6 && !strncmp(arg, "--nice", 6)) nice_by = atoi(value);
        else if (name_len == 6 && !strncmp(arg, "--cpus", 6)) cpus = value;
        else if (name_len == 9 && !strncmp(arg, "--poll-ms", 9)) poll_ms = atof(value);
        else usage();
    }
    if (npos != 3) usage();
    pool.port = atoi(positional[0]);
    int count_wanted = atoi(positional[2]);
    /* The collection is a slug (rsnotify.collection.collection_id): no character to escape. */
    snprintf(pool.path, sizeof pool.path, "/%s", positional[1]);
    pool.prefix_len = (size_t)snprintf(pool.prefix, sizeof pool.prefix,
                                       "{\"type\":\"notification\",\"collection\":\"%s\",\"seq\":",
                                       positional[1]);
    if (strpbrk(positional[1], "\"\\") || pool.prefix_len >= sizeof pool.prefix) usage();
    if (nice_by) {
        errno = 0;
        if (nice(nice_by) == -1 && errno) die("nice");
    }
    if (cpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (const char *p = cpus; *p;) {
            CPU_SET(atoi(p), &set);
            p += strcspn(p, ",");
            if (*p == ',') p++;
        }
        if (sched_setaffinity(0, sizeof set, &set) < 0) die("sched_setaffinity");
    }

    pool.epoll = epoll_create1(0);
    if (pool.epoll < 0) die("epoll_create1");
    if (fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK) < 0) die("stdin");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = STDIN_FILENO};
    if (epoll_ctl(pool.epoll, EPOLL_CTL_ADD, STDIN_FILENO, &ev) < 0) die("epoll_ctl stdin");
    reset(0);

    Out out = {0};
    char *commands = NULL;
    size_t commands_len = 0;
    double opening = -1;  /* monotonic time of "open", until all are open or failed */
    int to_open = 0;
    struct epoll_event events[1024];
    struct timespec pause = {.tv_sec = (time_t)(poll_ms / 1e3),
                             .tv_nsec = (long)((poll_ms / 1e3 - (time_t)(poll_ms / 1e3)) * 1e9)};
    for (;;) {
        if (opening >= 0) {
            while (to_open && pool.handshaking < CONNECT_SLOTS) {
                to_open--;
                connect_one();
            }
            if (!to_open && !pool.handshaking) {
                out_printf(&out, "{\"opened\": %d, \"failed\": [", pool.opened);
                /* sorted, as the Python client's sorted(set(...)) */
                for (int i = 1; i < pool.failed_count; i++) {
                    for (int j = i; j > 0 && strcmp(pool.failed[j - 1], pool.failed[j]) > 0; j--) {
                        char *t = pool.failed[j];
                        pool.failed[j] = pool.failed[j - 1];
                        pool.failed[j - 1] = t;
                    }
                }
                for (int i = 0; i < pool.failed_count; i++) {
                    if (i) out_printf(&out, ", ");
                    out_string(&out, pool.failed[i], strlen(pool.failed[i]));
                }
                out_printf(&out, "], \"seconds\": %.6f}", monotonic_s() - opening);
                reply(&out);
                opening = -1;
            }
        }
        int ready = epoll_wait(pool.epoll, events, 1024, poll_ms > 0 ? 0 : 1000);
        if (ready < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        if (ready == 0 && poll_ms > 0) {
            nanosleep(&pause, NULL);
            continue;
        }
        for (int e = 0; e < ready; e++) {
            int fd = events[e].data.fd;
            if (fd != STDIN_FILENO) {
                if ((size_t)fd < pool.clients_cap && pool.clients[fd]) readable(pool.clients[fd]);
                continue;
            }
            char chunk[4096];
            ssize_t n = read(STDIN_FILENO, chunk, sizeof chunk);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (n <= 0) return 0;
            commands = grow(commands, commands_len + (size_t)n);
            memcpy(commands + commands_len, chunk, (size_t)n);
            commands_len += (size_t)n;
            char *nl;
            while ((nl = memchr(commands, '\n', commands_len)) != NULL) {
                *nl = 0;
                char word[32] = "";
                long long number = 0;
                int fields = sscanf(commands, "%31s %lld", word, &number);
                size_t used = (size_t)(nl + 1 - commands);
                memmove(commands, nl + 1, commands_len - used);
                commands_len -= used;
                if (fields < 1 || !strcmp(word, "quit")) return 0;
                if (!strcmp(word, "open")) {
                    opening = monotonic_s();
                    to_open = count_wanted;
                    continue;
                }
                if (!strcmp(word, "stats")) {
                    stats(&out);
                } else {
                    if (!strcmp(word, "reset")) {
                        reset(number);
                    } else if (!strcmp(word, "target")) {
                        pool.target = number;
                        for (size_t i = 0; i < pool.clients_cap; i++) {
                            if (pool.clients[i]) pool.clients[i]->reached_at = 0;
                        }
                    }
                    out_printf(&out, "{\"ok\": true}");
                }
                reply(&out);
            }
        }
    }
}
