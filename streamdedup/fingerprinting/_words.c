/* Word hashes of many texts in C, read from the texts' own storage (streamdedup.fingerprinting.features).
 *
 * features.py defines words and their hashes; numba_kernels.word_hashes is the loop this file mirrors,
 * run there over a copy of the texts as UTF-16 or UTF-32 code units (tokens.encode_batch).  Here the
 * loop reads each str's code points where CPython keeps them (one, two or four bytes a code point), so
 * the copy is never made.  Everything the rule needs comes from Python: the code-point table (lower-case
 * code point | class << 21, tokens.table), the seed and the multiplier.  Two details of encode_batch
 * are followed exactly: a text holding U+0130 or U+03A3 is lower-cased as a whole first (str.lower is
 * contextual there), and a lone surrogate is a separator (encode_batch's "replace" makes it "?").
 * tests/test_kernels.py holds this to the numba and numpy paths, bit for bit.
 *
 * Built when a C compiler is there (setup.py: optional); without it the numba kernel runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CLASS_SHIFT 21
#define LOW_MASK ((1u << CLASS_SHIFT) - 1)
#define WORD 1
#define NOSPACE_CHAR 2

static inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* h = w ? next : seed, as a conditional move: whether a code point is a word character changes every few
 * code points, too often for a branch to be predicted (gcc makes this one a branch: 2.2 ns a code point
 * here, 1.6 with the move). */
#if defined(__GNUC__) && defined(__x86_64__)
#define SELECT(h, next, w, seed)                                                                       \
    do {                                                                                               \
        h = seed;                                                                                      \
        __asm__("test %2, %2\n\tcmovnz %1, %0" : "+r"(h) : "r"(next), "r"(w) : "cc");                 \
    } while (0)
#else
#define SELECT(h, next, w, seed) h = (w) ? (next) : (seed)
#endif

/* The words of one text's code points, appended to out as unmixed polynomials (mix64 comes after);
 * returns the new end.  No branch on the word boundaries: the current polynomial is stored at every
 * code point and kept (the end moves on) only where a word ends. */
#define WORD_LOOP(T)                                                                                   \
    static uint64_t *words_##T(const T *s, Py_ssize_t len, const uint32_t *table, uint64_t seed,         \
                               uint64_t mul, uint64_t *out) {                                           \
        uint64_t h = seed, inword = 0;                                                                  \
        for (Py_ssize_t i = 0; i < len; i++) {                                                          \
            uint32_t e = table[s[i]];                                                                   \
            uint32_t k = e >> CLASS_SHIFT;                                                              \
            uint64_t w = k == WORD;                                                                     \
            *out = h; /* (room: at most one word per code point, and this one is not kept yet) */      \
            out += inword & (w ^ 1);                                                                    \
            uint64_t next = h * mul + (e & LOW_MASK);                                                   \
            SELECT(h, next, w, seed);                                                                   \
            inword = w;                                                                                 \
            if (k == NOSPACE_CHAR) *out++ = seed * mul + (e & LOW_MASK); /* a word on its own */       \
        }                                                                                               \
        if (inword) *out++ = h;                                                                         \
        return out;                                                                                     \
    }
WORD_LOOP(Py_UCS1)
WORD_LOOP(Py_UCS2)
WORD_LOOP(Py_UCS4)

/* True when the text holds U+0130 or U+03A3 (never in a one-byte text). */
static int contextual(PyObject *text) {
    int kind = PyUnicode_KIND(text);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *s = PyUnicode_2BYTE_DATA(text);
        for (Py_ssize_t i = 0; i < len; i++)
            if (s[i] == 0x130 || s[i] == 0x3A3) return 1;
    } else if (kind == PyUnicode_4BYTE_KIND) {
        const Py_UCS4 *s = PyUnicode_4BYTE_DATA(text);
        for (Py_ssize_t i = 0; i < len; i++)
            if (s[i] == 0x130 || s[i] == 0x3A3) return 1;
    }
    return 0;
}

static int get_table(PyObject *obj, Py_buffer *view, Py_ssize_t need) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != 4 || view->len < need * 4) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "the code-point table must hold at least %zd uint32 entries", need);
        return -1;
    }
    return 0;
}

/* word_hashes(texts, bmp_table, full_table, seed, mul) -> (hashes: bytearray of uint64, counts:
 * bytearray of int64), or None when a text has code points beyond U+FFFF and full_table is None. */
static PyObject *word_hashes(PyObject *self, PyObject *args) {
    PyObject *texts, *bmp_obj, *full_obj, *seq = NULL, *result = NULL;
    unsigned long long seed, mul;
    Py_buffer bmp = {0}, full = {0};
    uint64_t *out = NULL;
    int64_t *counts = NULL;
    if (!PyArg_ParseTuple(args, "OOOKK", &texts, &bmp_obj, &full_obj, &seed, &mul)) return NULL;
    if (!(seq = PySequence_Fast(texts, "texts must be a sequence of str"))) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int astral = 0;
    for (Py_ssize_t d = 0; d < n; d++) {
        if (!PyUnicode_Check(items[d])) {
            PyErr_Format(PyExc_TypeError, "texts must be str, not %.80s", Py_TYPE(items[d])->tp_name);
            goto done;
        }
        if (PyUnicode_READY(items[d]) < 0) goto done;
        total += PyUnicode_GET_LENGTH(items[d]);
        astral |= PyUnicode_KIND(items[d]) == PyUnicode_4BYTE_KIND;
    }
    if (astral && full_obj == Py_None) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (get_table(bmp_obj, &bmp, 0x10000) < 0) goto done;
    if (full_obj != Py_None && get_table(full_obj, &full, 0x110000) < 0) goto done;
    /* at most one word per code point */
    out = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(uint64_t));
    counts = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!out || !counts) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *end = out;
    for (Py_ssize_t d = 0; d < n; d++) {
        PyObject *text = items[d], *lowered = NULL;
        uint64_t *first = end;
        if (contextual(text)) {
            if (!(lowered = PyObject_CallMethod(text, "lower", NULL))) goto done;
            if (PyUnicode_GET_LENGTH(lowered) > PyUnicode_GET_LENGTH(text)) {
                /* (İ lower-cases to two code points: room for the longer text) */
                Py_ssize_t used = end - out, more = PyUnicode_GET_LENGTH(lowered) - PyUnicode_GET_LENGTH(text);
                uint64_t *grown = PyMem_Realloc(out, (size_t)(total + more) * sizeof(uint64_t));
                if (!grown) {
                    Py_DECREF(lowered);
                    PyErr_NoMemory();
                    goto done;
                }
                out = grown, end = out + used, first = end, total += more;
            }
            text = lowered;
        }
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        switch (PyUnicode_KIND(text)) {
        case PyUnicode_1BYTE_KIND:
            end = words_Py_UCS1(PyUnicode_1BYTE_DATA(text), len, bmp.buf, seed, mul, end);
            break;
        case PyUnicode_2BYTE_KIND:
            end = words_Py_UCS2(PyUnicode_2BYTE_DATA(text), len, bmp.buf, seed, mul, end);
            break;
        default:
            if (!full.buf) { /* only a lowered text can get here: ask for the table, as for any other */
                Py_XDECREF(lowered);
                result = Py_None;
                Py_INCREF(result);
                goto done;
            }
            end = words_Py_UCS4(PyUnicode_4BYTE_DATA(text), len, full.buf, seed, mul, end);
        }
        Py_XDECREF(lowered);
        counts[d] = end - first;
    }
    for (uint64_t *p = out; p < end; p++) *p = mix64(*p);
    /* bytearrays: numpy arrays over them are writable, as the other paths' are */
    PyObject *h = PyByteArray_FromStringAndSize((const char *)out, (Py_ssize_t)((end - out) * sizeof(uint64_t)));
    PyObject *c = h ? PyByteArray_FromStringAndSize((const char *)counts, n * (Py_ssize_t)sizeof(int64_t)) : NULL;
    if (h && c) result = PyTuple_Pack(2, h, c);
    Py_XDECREF(h);
    Py_XDECREF(c);
done:
    PyMem_Free(out);
    PyMem_Free(counts);
    if (bmp.obj) PyBuffer_Release(&bmp);
    if (full.obj) PyBuffer_Release(&full);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"word_hashes", word_hashes, METH_VARARGS,
     "word_hashes(texts, bmp_table, full_table, seed, mul) -> (hashes, counts) as bytearrays of uint64 "
     "and int64, or None when a text needs full_table and it is None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_words", NULL, -1, methods};

PyMODINIT_FUNC PyInit__words(void) { return PyModule_Create(&module); }
