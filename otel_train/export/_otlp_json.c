/* An encoded OTLP `ExportTraceServiceRequest` as one line of OTLP JSON, read straight off the
 * protobuf wire.
 *
 * The same bytes as the Python converter `otlp_json.trace_request_json_python` (parse with
 * upb, build dicts, `json.dumps(doc, separators=(",", ":"))`) for every request protobuf parses;
 * it is the fallback where this module was not built. `tests/test_otlp_json_c.py` holds the two
 * to the same bytes (random requests, random corruptions of them). What this reader skips it
 * does not check (a trace state's UTF-8, a scope's own attributes), so a request protobuf
 * refuses as corrupt may still be written from the fields read here; the pipeline's encoder
 * never makes one. Why: the
 * embedded default (a JSON-lines file) spent ~4x the exporter process's CPU of OTLP/gRPC, nearly
 * all of it in that parse and those dicts (docs/benchmarks/2026-11-26-json-lines-c.md).
 *
 * Anything this reader is not sure to render exactly as the Python converter does raises
 * ValueError, and the caller falls back to Python: a wire type that does not match a field's
 * type, a singular message field given twice (protobuf would merge them), an AnyValue with more
 * than one of its oneof set, a string that is not valid UTF-8, a truncated message. Fields the
 * JSON line does not carry (`flags`, `trace_state`, dropped counts, schema URLs, unknown
 * fields) are skipped, as the Python converter ignores them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* --- output buffer ------------------------------------------------------------------------ */
typedef struct {
    char *p;
    size_t len, cap;
} Out;

static int out_reserve(Out *o, size_t more) {
    if (o->len + more <= o->cap) {
        return 0;
    }
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more) {
        cap *= 2;
    }
    char *p = PyMem_Realloc(o->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->p = p;
    o->cap = cap;
    return 0;
}

static int put(Out *o, const char *s, size_t n) {
    if (out_reserve(o, n) < 0) {
        return -1;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
    return 0;
}

#define PUT_LIT(o, s) put((o), (s), sizeof(s) - 1)

static int put_u64(Out *o, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[sizeof(tmp) - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return put(o, tmp + sizeof(tmp) - n, (size_t)n);
}

static int put_i64(Out *o, int64_t v) {
    if (v < 0) {
        if (PUT_LIT(o, "-") < 0) {
            return -1;
        }
        return put_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(o, (uint64_t)v);
}

/* A 64-bit integer as OTLP JSON writes it: in quotes. */
static int put_u64_str(Out *o, uint64_t v) {
    return PUT_LIT(o, "\"") < 0 || put_u64(o, v) < 0 || PUT_LIT(o, "\"") < 0 ? -1 : 0;
}

static const char HEX[] = "0123456789abcdef";

static int put_hex(Out *o, const uint8_t *b, size_t n) {
    if (out_reserve(o, 2 * n + 2) < 0) {
        return -1;
    }
    char *w = o->p + o->len;
    *w++ = '"';
    for (size_t i = 0; i < n; i++) {
        *w++ = HEX[b[i] >> 4];
        *w++ = HEX[b[i] & 15];
    }
    *w++ = '"';
    o->len = (size_t)(w - o->p);
    return 0;
}

static char *put_u_escape(char *w, unsigned c) {
    *w++ = '\\';
    *w++ = 'u';
    *w++ = HEX[(c >> 12) & 15];
    *w++ = HEX[(c >> 8) & 15];
    *w++ = HEX[(c >> 4) & 15];
    *w++ = HEX[c & 15];
    return w;
}

/* A UTF-8 string as `json.dumps` writes it (ensure_ascii): printable ASCII as is, the usual
 * two-character escapes, every other code point as \uXXXX (a surrogate pair above U+FFFF).
 * Invalid UTF-8 (overlong, a surrogate, past U+10FFFF, cut short) is -2, no exception set. */
static int put_string(Out *o, const uint8_t *s, size_t n) {
    if (out_reserve(o, 6 * n + 2) < 0) { /* at most 6 characters a byte */
        return -1;
    }
    char *w = o->p + o->len;
    *w++ = '"';
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            if (c >= ' ' && c <= '~' && c != '\\' && c != '"') {
                *w++ = (char)c;
                continue;
            }
            switch (c) {
            case '\\': *w++ = '\\'; *w++ = '\\'; continue;
            case '"': *w++ = '\\'; *w++ = '"'; continue;
            case '\b': *w++ = '\\'; *w++ = 'b'; continue;
            case '\f': *w++ = '\\'; *w++ = 'f'; continue;
            case '\n': *w++ = '\\'; *w++ = 'n'; continue;
            case '\r': *w++ = '\\'; *w++ = 'r'; continue;
            case '\t': *w++ = '\\'; *w++ = 't'; continue;
            default: w = put_u_escape(w, c); continue;
            }
        }
        int extra;
        unsigned min;
        if ((c & 0xE0) == 0xC0) {
            extra = 1, min = 0x80, c &= 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            extra = 2, min = 0x800, c &= 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            extra = 3, min = 0x10000, c &= 0x07;
        } else {
            return -2;
        }
        if ((size_t)extra >= n - i) {
            return -2;  /* cut short */
        }
        for (int k = 1; k <= extra; k++) {
            unsigned b = s[i + (size_t)k];
            if ((b & 0xC0) != 0x80) {
                return -2;
            }
            c = (c << 6) | (b & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
            return -2;
        }
        i += (size_t)extra + 1;
        if (c >= 0x10000) {
            c -= 0x10000;
            w = put_u_escape(w, 0xD800 | (c >> 10));
            c = 0xDC00 | (c & 0x3FF);
        }
        w = put_u_escape(w, c);
    }
    *w++ = '"';
    o->len = (size_t)(w - o->p);
    return 0;
}

/* --- protobuf wire ------------------------------------------------------------------------ */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

typedef struct {
    uint32_t num;
    int wt;
    uint64_t v;           /* a varint's, fixed64's or fixed32's value */
    const uint8_t *data;  /* a length-delimited field's bytes */
    size_t len;
} Field;

typedef struct {
    const uint8_t *p, *end;
} Rd;

static int read_varint(Rd *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end) {
            return -1;
        }
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* The next field: 1, 0 at the end, -1 when malformed (groups, a length past the end). */
static int next_field(Rd *r, Field *f) {
    if (r->p >= r->end) {
        return 0;
    }
    uint64_t tag;
    if (read_varint(r, &tag) < 0 || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF) {
        return -1;
    }
    f->num = (uint32_t)(tag >> 3);
    f->wt = (int)(tag & 7);
    switch (f->wt) {
    case WT_VARINT:
        return read_varint(r, &f->v) < 0 ? -1 : 1;
    case WT_I64:
        if (r->end - r->p < 8) {
            return -1;
        }
        f->v = 0;
        for (int i = 7; i >= 0; i--) {
            f->v = (f->v << 8) | r->p[i];
        }
        r->p += 8;
        return 1;
    case WT_I32:
        if (r->end - r->p < 4) {
            return -1;
        }
        f->v = (uint64_t)r->p[0] | (uint64_t)r->p[1] << 8 | (uint64_t)r->p[2] << 16 | (uint64_t)r->p[3] << 24;
        r->p += 4;
        return 1;
    case WT_LEN: {
        uint64_t n;
        if (read_varint(r, &n) < 0 || n > (uint64_t)(r->end - r->p)) {
            return -1;
        }
        f->data = r->p;
        f->len = (size_t)n;
        r->p += n;
        return 1;
    }
    default:
        return -1;
    }
}

/* -1: an exception is set; -2: not ours to render (the caller raises ValueError). */
#define NOT_OURS (-2)
#define TRY(x)                 \
    do {                       \
        int rc_ = (x);         \
        if (rc_ < 0) {         \
            return rc_;        \
        }                      \
    } while (0)
#define WANT(f, type)            \
    do {                         \
        if ((f).wt != (type)) {  \
            return NOT_OURS;     \
        }                        \
    } while (0)

typedef struct {
    const uint8_t *data;
    size_t len;
    int seen;
} Slice;

static int put_slice_string(Out *o, const Slice *s) {
    int rc = put_string(o, s->data, s->len);
    return rc == -2 ? NOT_OURS : rc;
}

typedef int (*Render)(Out *o, const uint8_t *p, size_t n);

/* Every field `field` of a message, each rendered by `render`, as a JSON list. */
static int put_list(Out *o, const uint8_t *p, size_t n, uint32_t field, Render render) {
    Rd r = {p, p + n};
    Field f;
    int rc, first = 1;
    TRY(PUT_LIT(o, "["));
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.num != field) {
            continue;
        }
        WANT(f, WT_LEN);
        TRY(first ? 0 : PUT_LIT(o, ","));
        first = 0;
        TRY(render(o, f.data, f.len));
    }
    if (rc < 0) {
        return NOT_OURS;
    }
    return PUT_LIT(o, "]");
}

static int key_value(Out *o, const uint8_t *p, size_t n);

/* `_json_value`: an AnyValue. */
static int any_value(Out *o, const uint8_t *p, size_t n) {
    Rd r = {p, p + n};
    Field f = {0}, which = {0};
    int rc, members = 0;
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.num >= 1 && f.num <= 7) {
            which = f;
            members++;
        }
    }
    if (rc < 0 || members > 1) {
        return NOT_OURS;
    }
    switch (which.num) {
    case 0:
        return PUT_LIT(o, "{}");
    case 1: {
        WANT(which, WT_LEN);
        Slice s = {which.data, which.len, 1};
        TRY(PUT_LIT(o, "{\"stringValue\":"));
        TRY(put_slice_string(o, &s));
        return PUT_LIT(o, "}");
    }
    case 2:
        WANT(which, WT_VARINT);
        return which.v ? PUT_LIT(o, "{\"boolValue\":true}") : PUT_LIT(o, "{\"boolValue\":false}");
    case 3:
        WANT(which, WT_VARINT);
        TRY(PUT_LIT(o, "{\"intValue\":\""));
        TRY(put_i64(o, (int64_t)which.v));
        return PUT_LIT(o, "\"}");
    case 4: {
        WANT(which, WT_I64);
        double d;
        memcpy(&d, &which.v, sizeof d);
        TRY(PUT_LIT(o, "{\"doubleValue\":"));
        if (Py_IS_NAN(d)) {
            TRY(PUT_LIT(o, "NaN"));
        } else if (Py_IS_INFINITY(d)) {
            TRY(d > 0 ? PUT_LIT(o, "Infinity") : PUT_LIT(o, "-Infinity"));
        } else {
            char *text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (text == NULL) {
                return -1;
            }
            rc = put(o, text, strlen(text));
            PyMem_Free(text);
            TRY(rc);
        }
        return PUT_LIT(o, "}");
    }
    case 5: {
        WANT(which, WT_LEN);
        TRY(PUT_LIT(o, "{\"arrayValue\":{\"values\":"));
        TRY(put_list(o, which.data, which.len, 1, any_value));
        return PUT_LIT(o, "}}");
    }
    case 6:
        WANT(which, WT_LEN);
        TRY(PUT_LIT(o, "{\"kvlistValue\":{\"values\":"));
        TRY(put_list(o, which.data, which.len, 1, key_value));
        return PUT_LIT(o, "}}");
    case 7: {
        WANT(which, WT_LEN);
        /* base64, as `base64.b64encode` */
        static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        TRY(PUT_LIT(o, "{\"bytesValue\":\""));
        TRY(out_reserve(o, 4 * (which.len / 3 + 1)));
        char *w = o->p + o->len;
        const uint8_t *b = which.data;
        size_t i = 0;
        for (; i + 3 <= which.len; i += 3) {
            uint32_t v = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8 | b[i + 2];
            *w++ = B64[v >> 18];
            *w++ = B64[(v >> 12) & 63];
            *w++ = B64[(v >> 6) & 63];
            *w++ = B64[v & 63];
        }
        if (which.len - i == 1) {
            uint32_t v = (uint32_t)b[i] << 16;
            *w++ = B64[v >> 18];
            *w++ = B64[(v >> 12) & 63];
            *w++ = '=';
            *w++ = '=';
        } else if (which.len - i == 2) {
            uint32_t v = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8;
            *w++ = B64[v >> 18];
            *w++ = B64[(v >> 12) & 63];
            *w++ = B64[(v >> 6) & 63];
            *w++ = '=';
        }
        o->len = (size_t)(w - o->p);
        return PUT_LIT(o, "\"}");
    }
    }
    return NOT_OURS;
}

/* One KeyValue (`_json_kvs` renders a list of them: `put_list(..., key_value)`). */
static int key_value(Out *o, const uint8_t *p, size_t n) {
    Rd kv = {p, p + n};
    Field g;
    int rc;
    Slice key = {(const uint8_t *)"", 0, 0}, value = {NULL, 0, 0};
    while ((rc = next_field(&kv, &g)) == 1) {
        if (g.num == 1) {
            WANT(g, WT_LEN);
            key = (Slice){g.data, g.len, 1};
        } else if (g.num == 2) {
            WANT(g, WT_LEN);
            if (value.seen) {
                return NOT_OURS;  /* protobuf would merge the two */
            }
            value = (Slice){g.data, g.len, 1};
        }
    }
    if (rc < 0) {
        return NOT_OURS;
    }
    TRY(PUT_LIT(o, "{\"key\":"));
    TRY(put_slice_string(o, &key));
    TRY(PUT_LIT(o, ",\"value\":"));
    TRY(value.seen ? any_value(o, value.data, value.len) : PUT_LIT(o, "{}"));
    return PUT_LIT(o, "}");
}

/* A singular message field (at most once: protobuf would merge repeats). */
static int take_message(const Field *f, Slice *s) {
    if (f->wt != WT_LEN || s->seen) {
        return NOT_OURS;
    }
    *s = (Slice){f->data, f->len, 1};
    return 0;
}

/* A singular scalar length-delimited field (string or bytes): the last one wins. */
static int take_bytes(const Field *f, Slice *s) {
    if (f->wt != WT_LEN) {
        return NOT_OURS;
    }
    *s = (Slice){f->data, f->len, 1};
    return 0;
}

static const Slice EMPTY = {(const uint8_t *)"", 0, 0};

/* A span's Event: {"timeUnixNano", "name", "attributes"}. */
static int span_event(Out *o, const uint8_t *p, size_t n) {
    Rd e = {p, p + n};
    Field g;
    int rc;
    Slice name = EMPTY;
    uint64_t time = 0;
    while ((rc = next_field(&e, &g)) == 1) {
        if (g.num == 1) {
            WANT(g, WT_I64);
            time = g.v;
        } else if (g.num == 2) {
            TRY(take_bytes(&g, &name));
        } else if (g.num == 3) {
            WANT(g, WT_LEN);
        }
    }
    if (rc < 0) {
        return NOT_OURS;
    }
    TRY(PUT_LIT(o, "{\"timeUnixNano\":"));
    TRY(put_u64_str(o, time));
    TRY(PUT_LIT(o, ",\"name\":"));
    TRY(put_slice_string(o, &name));
    TRY(PUT_LIT(o, ",\"attributes\":"));
    TRY(put_list(o, p, n, 3, key_value));
    return PUT_LIT(o, "}");
}

/* A span's Link: {"traceId", "spanId", "attributes"}. */
static int span_link(Out *o, const uint8_t *p, size_t n) {
    Rd l = {p, p + n};
    Field g;
    int rc;
    Slice trace = EMPTY, id = EMPTY;
    while ((rc = next_field(&l, &g)) == 1) {
        if (g.num == 1) {
            TRY(take_bytes(&g, &trace));
        } else if (g.num == 2) {
            TRY(take_bytes(&g, &id));
        } else if (g.num == 4) {
            WANT(g, WT_LEN);
        }
    }
    if (rc < 0) {
        return NOT_OURS;
    }
    TRY(PUT_LIT(o, "{\"traceId\":"));
    TRY(put_hex(o, trace.data, trace.len));
    TRY(PUT_LIT(o, ",\"spanId\":"));
    TRY(put_hex(o, id.data, id.len));
    TRY(PUT_LIT(o, ",\"attributes\":"));
    TRY(put_list(o, p, n, 4, key_value));
    return PUT_LIT(o, "}");
}

/* `_json_span`. */
static int span(Out *o, const uint8_t *p, size_t n) {
    Rd r = {p, p + n};
    Field f;
    int rc, events = 0, links = 0;
    Slice trace = EMPTY, id = EMPTY, parent = EMPTY, name = EMPTY, status = {NULL, 0, 0};
    uint64_t kind = 0, start = 0, end = 0;
    while ((rc = next_field(&r, &f)) == 1) {
        switch (f.num) {
        case 1: TRY(take_bytes(&f, &trace)); break;
        case 2: TRY(take_bytes(&f, &id)); break;
        case 4: TRY(take_bytes(&f, &parent)); break;
        case 5: TRY(take_bytes(&f, &name)); break;
        case 6: WANT(f, WT_VARINT); kind = f.v; break;
        case 7: WANT(f, WT_I64); start = f.v; break;
        case 8: WANT(f, WT_I64); end = f.v; break;
        case 9: WANT(f, WT_LEN); break;
        case 11: WANT(f, WT_LEN); events++; break;
        case 13: WANT(f, WT_LEN); links++; break;
        case 15: TRY(take_message(&f, &status)); break;
        case 3: WANT(f, WT_LEN); break;     /* trace_state */
        case 16: WANT(f, WT_I32); break;    /* flags */
        case 10: case 12: case 14: WANT(f, WT_VARINT); break;  /* dropped counts */
        default: break;
        }
    }
    if (rc < 0) {
        return NOT_OURS;
    }
    TRY(PUT_LIT(o, "{\"traceId\":"));
    TRY(put_hex(o, trace.data, trace.len));
    TRY(PUT_LIT(o, ",\"spanId\":"));
    TRY(put_hex(o, id.data, id.len));
    TRY(PUT_LIT(o, ",\"name\":"));
    TRY(put_slice_string(o, &name));
    TRY(PUT_LIT(o, ",\"kind\":"));
    TRY(put_i64(o, (int32_t)kind));
    TRY(PUT_LIT(o, ",\"startTimeUnixNano\":"));
    TRY(put_u64_str(o, start));
    TRY(PUT_LIT(o, ",\"endTimeUnixNano\":"));
    TRY(put_u64_str(o, end));
    TRY(PUT_LIT(o, ",\"attributes\":"));
    TRY(put_list(o, p, n, 9, key_value));
    /* Status: message 2, code 3. */
    Slice message = EMPTY;
    uint64_t code = 0;
    if (status.seen) {
        Rd s = {status.data, status.data + status.len};
        while ((rc = next_field(&s, &f)) == 1) {
            if (f.num == 2) {
                TRY(take_bytes(&f, &message));
            } else if (f.num == 3) {
                WANT(f, WT_VARINT);
                code = f.v;
            }
        }
        if (rc < 0) {
            return NOT_OURS;
        }
    }
    TRY(PUT_LIT(o, ",\"status\":"));
    if ((int32_t)code || message.len) {
        TRY(PUT_LIT(o, "{\"code\":"));
        TRY(put_i64(o, (int32_t)code));
        if (message.len) {
            TRY(PUT_LIT(o, ",\"message\":"));
            TRY(put_slice_string(o, &message));
        }
        TRY(PUT_LIT(o, "}"));
    } else {
        TRY(PUT_LIT(o, "{}"));
    }
    if (parent.len) {
        TRY(PUT_LIT(o, ",\"parentSpanId\":"));
        TRY(put_hex(o, parent.data, parent.len));
    }
    if (events) {
        TRY(PUT_LIT(o, ",\"events\":"));
        TRY(put_list(o, p, n, 11, span_event));
    }
    if (links) {
        TRY(PUT_LIT(o, ",\"links\":"));
        TRY(put_list(o, p, n, 13, span_link));
    }
    return PUT_LIT(o, "}");
}

/* A ResourceSpans' or ScopeSpans' head: its singular message in field 1 (the resource, the
 * scope), field 2 (the repeated list `put_list` renders) checked for its wire type. */
static int take_head(const uint8_t *p, size_t n, Slice *head) {
    Rd r = {p, p + n};
    Field f;
    int rc;
    *head = (Slice){NULL, 0, 0};
    while ((rc = next_field(&r, &f)) == 1) {
        if (f.num == 1) {
            TRY(take_message(&f, head));
        } else if (f.num == 2) {
            WANT(f, WT_LEN);
        }
    }
    return rc < 0 ? NOT_OURS : 0;
}

/* A ScopeSpans: {"scope": {"name", "version"}, "spans": [...]}. */
static int scope_spans(Out *o, const uint8_t *p, size_t n) {
    Field f;
    int rc;
    Slice scope;
    TRY(take_head(p, n, &scope));
    Slice name = EMPTY, version = EMPTY;
    if (scope.seen) {
        Rd s = {scope.data, scope.data + scope.len};
        while ((rc = next_field(&s, &f)) == 1) {
            if (f.num == 1) {
                TRY(take_bytes(&f, &name));
            } else if (f.num == 2) {
                TRY(take_bytes(&f, &version));
            }
        }
        if (rc < 0) {
            return NOT_OURS;
        }
    }
    TRY(PUT_LIT(o, "{\"scope\":{\"name\":"));
    TRY(put_slice_string(o, &name));
    TRY(PUT_LIT(o, ",\"version\":"));
    TRY(put_slice_string(o, &version));
    TRY(PUT_LIT(o, "},\"spans\":"));
    TRY(put_list(o, p, n, 2, span));
    return PUT_LIT(o, "}");
}

/* A ResourceSpans: {"resource": {"attributes": [...]}, "scopeSpans": [...]}. */
static int resource_spans(Out *o, const uint8_t *p, size_t n) {
    Slice resource;
    TRY(take_head(p, n, &resource));
    TRY(PUT_LIT(o, "{\"resource\":{\"attributes\":"));
    if (resource.seen) {
        TRY(put_list(o, resource.data, resource.len, 1, key_value));
    } else {
        TRY(PUT_LIT(o, "[]"));
    }
    TRY(PUT_LIT(o, "},\"scopeSpans\":"));
    TRY(put_list(o, p, n, 2, scope_spans));
    return PUT_LIT(o, "}");
}

static int request(Out *o, const uint8_t *p, size_t n) {
    TRY(PUT_LIT(o, "{\"resourceSpans\":"));
    TRY(put_list(o, p, n, 1, resource_spans));
    return PUT_LIT(o, "}");
}

PyDoc_STRVAR(trace_request_doc,
             "trace_request(payload) -> bytes\n\n"
             "An encoded ExportTraceServiceRequest as one line of OTLP JSON (no newline), the bytes\n"
             "`otlp_json.trace_request_json_python` makes. ValueError where it is not sure to.");

static PyObject *trace_request(PyObject *Py_UNUSED(module), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Out o = {NULL, 0, 0};
    int rc = out_reserve(&o, 3 * (size_t)view.len + 64);
    if (rc == 0) {
        rc = request(&o, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (rc == 0) {
        result = PyBytes_FromStringAndSize(o.p, (Py_ssize_t)o.len);
    } else if (rc == NOT_OURS) {
        PyErr_SetString(PyExc_ValueError, "not an OTLP trace request this reader renders exactly");
    }
    PyMem_Free(o.p);
    return result;
}

static PyMethodDef methods[] = {
    {"trace_request", trace_request, METH_O, trace_request_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_otlp_json",
    "OTLP trace requests as OTLP JSON lines, read straight off the protobuf wire.", -1, methods,
};

PyMODINIT_FUNC PyInit__otlp_json(void) {
    return PyModule_Create(&module_def);
}
