/* The common page record read in one pass (records.py's fast path): a flat JSON object whose values
 * are strings (or null), its "content" unescaped straight to UTF-8 bytes, the form lexbor parses, so
 * the page never becomes a Python str and is not encoded back.
 *
 * flat_record(raw) -> (url, content, id, content_type, fetched_at) or None; content as bytes.
 *
 * None whenever the record is anything else: another key, a key twice, a value that is not a
 * string (null is taken for the optional keys), an escape in a key, invalid UTF-8, a raw control
 * character, an invalid escape, a lone surrogate, "\u0000", a BOM, bytes after the object.  The
 * caller then reads the record as it always did (orjson, json), so every record that is not plain
 * gets the answer it got before; a plain one gets the values json.loads gives (tests/test_records.py
 * holds the two to the same pages and errors on hypothesis records).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef unsigned char uchar;

static const char *const KEYS[5] = {"url", "content", "id", "content_type", "fetched_at"};

static inline const uchar *skip_ws(const uchar *p, const uchar *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static inline int hex4(const uchar *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        uchar c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if ((c | 32) >= 'a' && (c | 32) <= 'f')
            v |= (c | 32) - 'a' + 10;
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (2-4), or 0: CPython's decoder's rules (no overlong
 * forms, no surrogates, nothing above U+10FFFF). */
static inline int utf8_seq(const uchar *p, const uchar *end) {
    uchar c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return end - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* a surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;  /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}

static inline uchar *put_cp(uchar *o, unsigned cp) {
    if (cp < 0x80) {
        *o++ = (uchar)cp;
    } else if (cp < 0x800) {
        *o++ = (uchar)(0xC0 | cp >> 6);
        *o++ = (uchar)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (uchar)(0xE0 | cp >> 12);
        *o++ = (uchar)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (uchar)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (uchar)(0xF0 | cp >> 18);
        *o++ = (uchar)(0x80 | (cp >> 12 & 0x3F));
        *o++ = (uchar)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (uchar)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* The index in memory of the first byte of m (loaded from 8 bytes) with its top bit set (m != 0).
 * A byte flagged in error only makes the caller look at a plain byte on its own. */
static inline int first_byte(uint64_t m) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_clzll(m) >> 3;
#elif defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(m) >> 3;
#else
    unsigned char b[8];
    memcpy(b, &m, 8);
    int k = 0;
    while (!(b[k] & 0x80)) k++;
    return k;
#endif
}

/* The JSON string at *pp (just past its opening quote) unescaped into out (room: its raw length);
 * *pp is left past the closing quote.  -1: not a plain string (see the top). */
static Py_ssize_t unescape(const uchar **pp, const uchar *end, uchar *out) {
    const uchar *p = *pp;
    uchar *o = out;
    for (;;) {
        /* a run of plain ASCII, eight bytes at a time: copied whole, then cut where the first quote,
         * backslash, control or high byte stood (on a little-endian machine the first byte flagged
         * is one: the tests below can flag a byte after a true one, never before).  (o may write 8
         * bytes: o - out is at most the bytes read, and out has room for all up to the record's end.) */
        while (end - p >= 8) {
            uint64_t x;
            memcpy(&x, p, 8);
            uint64_t hi = x & 0x8080808080808080ull;
            uint64_t ctl = (x - 0x2020202020202020ull) & ~x & 0x8080808080808080ull;
            uint64_t q = x ^ 0x2222222222222222ull, b = x ^ 0x5C5C5C5C5C5C5C5Cull;
            uint64_t quote = (q - 0x0101010101010101ull) & ~q & 0x8080808080808080ull;
            uint64_t bs = (b - 0x0101010101010101ull) & ~b & 0x8080808080808080ull;
            uint64_t m = hi | ctl | quote | bs;
            memcpy(o, &x, 8);
            if (!m) {
                o += 8, p += 8;
                continue;
            }
            int k = first_byte(m);
            o += k, p += k;
            break;
        }
        if (p >= end) return -1; /* no closing quote */
        uchar c = *p;
        if (c == '"') {
            *pp = p + 1;
            return o - out;
        }
        if (c < 0x20) return -1;
        if (c < 0x80 && c != '\\') {
            *o++ = c, p++;
            continue;
        }
        if (c >= 0x80) {
            int n = utf8_seq(p, end);
            if (!n) return -1;
            memcpy(o, p, n);
            o += n, p += n;
            continue;
        }
        /* an escape */
        if (end - p < 2) return -1;
        uchar e = p[1];
        p += 2;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (end - p < 4 || hex4(p, &cp) < 0) return -1;
            p += 4;
            if (cp == 0) return -1; /* (NUL: the reader before us decides what it makes of one) */
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
                    return -1; /* a lone high surrogate */
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            o = put_cp(o, cp);
            break;
        }
        default: return -1;
        }
    }
}

static PyObject *flat_record(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uchar *p = view.buf, *end = p + view.len;
    PyObject *vals[5] = {NULL, NULL, NULL, NULL, NULL};
    int seen[5] = {0, 0, 0, 0, 0};
    uchar *scratch = NULL;
    PyObject *result = NULL;
    int plain = 0;

    p = skip_ws(p, end);
    if (p >= end || *p != '{') goto done;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') goto done; /* {}: the reader before us has the error */
    for (;;) {
        if (p >= end || *p != '"') goto done;
        const uchar *k = ++p;
        while (p < end && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80) p++;
        if (p >= end || *p != '"') goto done;
        size_t klen = p - k;
        int which = -1;
        for (int i = 0; i < 5; i++)
            if (strlen(KEYS[i]) == klen && !memcmp(KEYS[i], k, klen)) which = i;
        if (which < 0 || seen[which]) goto done;
        seen[which] = 1;
        p = skip_ws(p + 1, end);
        if (p >= end || *p != ':') goto done;
        p = skip_ws(p + 1, end);
        if (p >= end) goto done;
        if (*p == 'n') {
            if (which < 2 || end - p < 4 || memcmp(p, "null", 4)) goto done;
            p += 4;
            Py_INCREF(Py_None);
            vals[which] = Py_None;
        } else if (*p == '"') {
            p++;
            size_t room = (size_t)(end - p); /* (bounds the unescaped string: no escape grows) */
            if (which == 1) { /* the content: straight into a bytes object, cut to size */
                PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)room);
                if (!b) goto fail;
                Py_ssize_t n = unescape(&p, end, (uchar *)PyBytes_AS_STRING(b));
                if (n < 0) {
                    Py_DECREF(b);
                    goto done;
                }
                if (_PyBytes_Resize(&b, n) < 0) goto fail;
                vals[1] = b;
            } else {
                if (!scratch && !(scratch = PyMem_Malloc(view.len ? (size_t)view.len : 1))) {
                    PyErr_NoMemory();
                    goto fail;
                }
                Py_ssize_t n = unescape(&p, end, scratch);
                if (n < 0) goto done;
                vals[which] = PyUnicode_DecodeUTF8((const char *)scratch, n, "strict");
                if (!vals[which]) goto fail;
            }
        } else
            goto done;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == '}') break;
        goto done;
    }
    p = skip_ws(p + 1, end);
    plain = p == end && vals[0] && vals[1] && vals[0] != Py_None && vals[1] != Py_None;
done:
    if (plain) {
        for (int i = 2; i < 5; i++)
            if (!vals[i]) {
                Py_INCREF(Py_None);
                vals[i] = Py_None;
            }
        result = PyTuple_Pack(5, vals[0], vals[1], vals[2], vals[3], vals[4]);
    } else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
fail:
    for (int i = 0; i < 5; i++) Py_XDECREF(vals[i]);
    PyMem_Free(scratch);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"flat_record", flat_record, METH_O, "flat_record(raw) -> (url, content, id, content_type, fetched_at) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&module); }
