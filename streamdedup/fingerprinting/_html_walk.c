/* The visible-text walk of streamdedup.fingerprinting.text in C, over the tree selectolax's lexbor parsed.
 *
 * text.py's `_walk` is the reference: this file does the same changes to the tree in the same order (the
 * same elements met, the same space text nodes inserted, the same nodes removed, the same texts read), so
 * it gives the same text bit for bit; tests/test_html_walk.py holds the two to that.  What it saves is the
 * Python around every element (a node object, a dict lookup, an attribute dict), which cost ~2.5 x
 * lexbor's own parse; this walk costs ~0.5 x.
 *
 * No lexbor headers: the functions are looked up by name in selectolax's own extension module (which
 * exports lexbor's API), so the walk runs on the very lexbor that parsed the page; nodes stay opaque
 * pointers.  Where a field is read directly it was found at `init`: a text node's data by probing text
 * nodes of known content, a node's links, tag id and type by comparing a sample tree's memory with what
 * lexbor's accessor functions say (used only where every node of the sample agrees at one offset).  The word lists and tag ids come from text.py at `init`; attribute values and tag
 * names that are not ASCII go back to text.py's own functions (their `lower()` and `split()` are
 * Unicode's).
 *
 * Built when a C compiler is there (setup.py: optional); without it text.py walks in Python.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* memmem */
#include <Python.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

typedef struct lxb_node node_t; /* lexbor's lxb_dom_node_t, never dereferenced here */
typedef struct lxb_attr attr_t;
typedef unsigned char uchar;

static node_t *(*noi_first_child)(node_t *);
static node_t *(*noi_next)(node_t *);
static node_t *(*noi_prev)(node_t *);
static node_t *(*noi_parent)(node_t *);
static uintptr_t (*noi_tag_id)(node_t *);
static int (*noi_type)(node_t *);
static attr_t *(*lx_first_attr)(node_t *);
static attr_t *(*lx_next_attr)(attr_t *);
static const uchar *(*lx_attr_name)(attr_t *, size_t *);
static const uchar *(*lx_attr_value)(attr_t *, size_t *);
static const uchar *(*lx_elem_name)(node_t *, size_t *);
static void (*lx_remove)(node_t *);
static node_t *(*lx_create_text)(node_t *, const uchar *, size_t);
static void (*lx_insert_before)(node_t *, node_t *);
static void (*lx_insert_after)(node_t *, node_t *);

static Py_ssize_t text_offset = -1; /* where a text node holds its lexbor_str_t {data, length} */
#define NODE_ELEMENT 1

/* A node's links, tag id and type: read from the node where `init` found (and checked, on a sample
 * tree, against lexbor's own accessor functions) where lexbor keeps them, else by those functions. */
static int direct;
static Py_ssize_t off_first_child, off_next, off_prev, off_parent, off_tag_id, off_type;

static inline void *field(node_t *n, Py_ssize_t off) {
    void *p;
    memcpy(&p, (const char *)n + off, sizeof(p));
    return p;
}
static inline node_t *lx_first_child(node_t *n) { return direct ? field(n, off_first_child) : noi_first_child(n); }
static inline node_t *lx_next(node_t *n) { return direct ? field(n, off_next) : noi_next(n); }
static inline node_t *lx_prev(node_t *n) { return direct ? field(n, off_prev) : noi_prev(n); }
static inline node_t *lx_parent(node_t *n) { return direct ? field(n, off_parent) : noi_parent(n); }
static inline uintptr_t lx_tag_id(node_t *n) { return direct ? (uintptr_t)field(n, off_tag_id) : noi_tag_id(n); }
static inline int lx_type(node_t *n) {
    int t;
    if (!direct) return noi_type(n);
    memcpy(&t, (const char *)n + off_type, sizeof(t));
    return t;
}

/* ---------------------------------------------------------------- configuration from text.py */
static uchar *kinds;      /* tag id -> 0 inline, 1 block, 2 always dropped, 3 semantic, 4 article/main, 5 inspected */
static uchar *wrappers;   /* tag id -> 1 for the wrappers that never take half the page */
static Py_ssize_t n_kinds;
static uintptr_t T_TEXT, T_HTML, T_BODY, T_MAIN, T_ARTICLE, T_FORM, T_HEADER, T_H1, T_H2;
static PyObject *py_verdict, *py_boiler_key; /* text.py's _attr_verdict and _boiler_key */

typedef struct {
    Py_ssize_t n;
    char **words;
    size_t *lens;
    int16_t table[256]; /* word index + 1 by hash, open addressing; 0 empty */
    uint64_t len_mask;   /* bit n: a word of n bytes is in the set (n < 64) */
    uint64_t first[4];   /* bit c: a word starts with byte c */
} wordset;
static wordset W_ROLES, W_PARTS, W_WHOLE, W_STATE, W_STATE_LAST, W_HPRE, W_HSUF;

static uint32_t fnv1a(const void *p, size_t n) {
    const uchar *b = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

static unsigned word_hash(const char *w, size_t n) {
    uint32_t h = fnv1a(w, n);
    return (h ^ (h >> 8)) & 255;
}

static int in_set(const wordset *s, const char *w, size_t n) {
    uchar c = n ? (uchar)w[0] : 0;
    if (n >= 64 || !((s->len_mask >> n) & 1) || !((s->first[c >> 6] >> (c & 63)) & 1)) return 0;
    for (unsigned h = word_hash(w, n);; h = (h + 1) & 255) {
        int i = s->table[h] - 1;
        if (i < 0) return 0;
        if (s->lens[i] == n && memcmp(s->words[i], w, n) == 0) return 1;
    }
}

static int load_set(wordset *s, PyObject *seq) {
    PyObject *fast = PySequence_Fast(seq, "word lists are sequences of str");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    s->words = PyMem_Calloc(n ? n : 1, sizeof(char *));
    s->lens = PyMem_Calloc(n ? n : 1, sizeof(size_t));
    if (!s->words || !s->lens) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(fast, i), &len);
        if (!u || !(s->words[i] = PyMem_Malloc(len + 1))) {
            Py_DECREF(fast);
            return -1;
        }
        memcpy(s->words[i], u, len + 1);
        s->lens[i] = (size_t)len;
        s->n = i + 1;
        if (len >= 64 || len == 0) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_ValueError, "words of 1 to 63 bytes expected");
            return -1;
        }
        if (i >= 200) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_ValueError, "at most 200 words a list");
            return -1;
        }
        unsigned h = word_hash(u, (size_t)len);
        while (s->table[h]) h = (h + 1) & 255;
        s->table[h] = (int16_t)(i + 1);
        s->len_mask |= 1ull << len;
        s->first[(uchar)u[0] >> 6] |= 1ull << ((uchar)u[0] & 63);
    }
    Py_DECREF(fast);
    return 0;
}

/* ---------------------------------------------------------------- growable arrays */
typedef struct {
    node_t **a;
    Py_ssize_t n, cap;
} nodes;

static int push(nodes *v, node_t *x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 256;
        node_t **a = PyMem_Realloc(v->a, cap * sizeof(node_t *));
        if (!a) {
            PyErr_NoMemory();
            return -1;
        }
        v->a = a;
        v->cap = cap;
    }
    v->a[v->n++] = x;
    return 0;
}

typedef struct {
    uchar *b;
    size_t n, cap;
} buf;

static int put(buf *s, const uchar *p, size_t n) {
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n) cap *= 2;
        uchar *b = PyMem_Realloc(s->b, cap);
        if (!b) {
            PyErr_NoMemory();
            return -1;
        }
        s->b = b;
        s->cap = cap;
    }
    if (n && p) memcpy(s->b + s->n, p, n);
    s->n += n;
    return 0;
}

/* A set of node pointers (open addressing; `protected` in text.py). */
typedef struct {
    uintptr_t *slot;
    size_t mask, n;
} ptrset;

static size_t ptr_hash(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull); }

static int set_has(const ptrset *s, node_t *x) {
    if (!s->slot) return 0;
    uintptr_t p = (uintptr_t)x;
    for (size_t i = ptr_hash(p) & s->mask;; i = (i + 1) & s->mask) {
        if (s->slot[i] == p) return 1;
        if (!s->slot[i]) return 0;
    }
}

static int set_add(ptrset *s, node_t *x) {
    if (!s->slot || (s->n + 1) * 2 > s->mask + 1) {
        size_t size = s->slot ? (s->mask + 1) * 2 : 64;
        uintptr_t *slot = PyMem_Calloc(size, sizeof(uintptr_t));
        if (!slot) {
            PyErr_NoMemory();
            return -1;
        }
        ptrset grown = {slot, size - 1, 0};
        for (size_t i = 0; s->slot && i <= s->mask; i++)
            if (s->slot[i]) set_add(&grown, (node_t *)s->slot[i]);
        PyMem_Free(s->slot);
        *s = grown;
    }
    uintptr_t p = (uintptr_t)x;
    size_t i = ptr_hash(p) & s->mask;
    while (s->slot[i] && s->slot[i] != p) i = (i + 1) & s->mask;
    if (!s->slot[i]) {
        s->slot[i] = p;
        s->n++;
    }
    return 0;
}

/* ---------------------------------------------------------------- tree */
static void text_of(node_t *t, const uchar **data, size_t *len) {
    const char *at = (const char *)t + text_offset;
    memcpy(data, at, sizeof(*data));
    memcpy(len, at + sizeof(uchar *), sizeof(*len));
}

/* The node after n in document order, within root's subtree (lxb_dom_node_simple_walk's step):
 * n's first child, else the next sibling of n or of its nearest ancestor below root; NULL at the end. */
static inline node_t *following(node_t *n, node_t *root) {
    node_t *c = lx_first_child(n);
    if (c) return c;
    while (n != root && !lx_next(n)) n = lx_parent(n);
    return n == root ? NULL : lx_next(n);
}

/* Whether the walk spaces element n off from its neighbours: text.py's walk inserts a " " text node
 * before and after every block element (kinds 1, 3, 4 and custom elements), which `node.text()`
 * then meets in document order.  Here none is inserted while the element stays: gather_text gives
 * the same bytes on entering and leaving it, and an element removed later gets its two real spaces
 * first (remove_spaced), where text.py's stay behind it. */
static inline int spaced_tag(uintptr_t t) {
    if (t >= 0x10000) return 1; /* a custom element (only elements have such ids) */
    uchar k = (Py_ssize_t)t < n_kinds ? kinds[t] : 0;
    return k && k != 2 && k != 5;
}

/* The bytes of the text nodes under `root`, in document order, with the spaces of the block
 * elements under it (not of root itself, whose spaces are its siblings): selectolax's
 * `node.text()` before its decode, on text.py's tree. */
static int gather_text(node_t *root, buf *out) {
    node_t *n = lx_first_child(root);
    while (n) {
        uintptr_t t = lx_tag_id(n);
        if (t == T_TEXT) {
            const uchar *d;
            size_t len;
            text_of(n, &d, &len);
            if (d && put(out, d, len) < 0) return -1;
        } else if (spaced_tag(t) && put(out, (const uchar *)" ", 1) < 0)
            return -1;
        node_t *c = lx_first_child(n);
        if (c) {
            n = c;
            continue;
        }
        for (;;) { /* n's subtree is done: its closing space, then the next node in document order */
            if (spaced_tag(lx_tag_id(n)) && put(out, (const uchar *)" ", 1) < 0) return -1; /* (a text: never) */
            node_t *next = lx_next(n);
            if (next) {
                n = next;
                break;
            }
            n = lx_parent(n);
            if (!n || n == root) {
                n = NULL;
                break;
            }
        }
    }
    return 0;
}

/* len(node.text()): code points of the UTF-8 decode with errors="replace". */
static Py_ssize_t text_len(node_t *root, buf *scratch) {
    scratch->n = 0;
    if (gather_text(root, scratch) < 0) return -1;
    if (!scratch->n) return 0;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)scratch->b, (Py_ssize_t)scratch->n, "replace");
    if (!s) return -1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    Py_DECREF(s);
    return n;
}

static int has_element(node_t *root, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d) {
    for (node_t *n = lx_first_child(root); n; n = following(n, root))
        if (lx_type(n) == NODE_ELEMENT) {
            uintptr_t t = lx_tag_id(n);
            if (t == a || t == b || t == c || t == d) return 1;
        }
    return 0;
}

static int insert_space(node_t *doc, node_t *n, int after) {
    node_t *sp = lx_create_text(doc, (const uchar *)" ", 1);
    if (!sp) {
        PyErr_SetString(PyExc_MemoryError, "lexbor could not create a text node");
        return -1;
    }
    (after ? lx_insert_after : lx_insert_before)(n, sp);
    return 0;
}

/* Remove element n from the tree, leaving its spaces (spaced_tag) as text nodes where it was. */
static int remove_spaced(node_t *doc, node_t *n) {
    if (spaced_tag(lx_tag_id(n)) && (insert_space(doc, n, 0) < 0 || insert_space(doc, n, 1) < 0)) return -1;
    lx_remove(n);
    return 0;
}

/* ---------------------------------------------------------------- text.py's word rules, ASCII only */
static int is_ws(uchar c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }
static uchar lower(uchar c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }
static int is_ascii(const uchar *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] & 0x80) return 0;
    return 1;
}

/* _HEADER_TOKEN.fullmatch: (prefix[-_])? header ([-_]suffix)? */
static int header_token(const char *t, size_t n) {
    for (int pre = -1; pre < W_HPRE.n; pre++) {
        size_t i = 0;
        if (pre >= 0) {
            size_t pl = W_HPRE.lens[pre];
            if (n < pl + 1 || memcmp(t, W_HPRE.words[pre], pl) != 0 || (t[pl] != '-' && t[pl] != '_')) continue;
            i = pl + 1;
        }
        if (n - i < 6 || memcmp(t + i, "header", 6) != 0) continue;
        i += 6;
        if (i == n) return 1;
        if ((t[i] == '-' || t[i] == '_') && in_set(&W_HSUF, t + i + 1, n - i - 1)) return 1;
    }
    return 0;
}

/* _boiler_key(tok) is not None, for an ASCII tok. */
static int boiler_key_of(const uchar *tok, size_t n);

/* boiler_key's answers for recent tokens (class tokens repeat all over a site's pages):
 * direct-mapped by the token's hash, tokens of up to 31 bytes. */
static struct {
    uchar len, answer;
    char tok[31];
} boiler_cache[1024];

static int boiler_key(const uchar *tok, size_t n) {
    if (n == 0 || n > sizeof(boiler_cache[0].tok)) return boiler_key_of(tok, n);
    uint32_t h = fnv1a(tok, n);
    h = (h ^ (h >> 10) ^ (h >> 20)) & 1023;
    if (boiler_cache[h].len == n && memcmp(boiler_cache[h].tok, tok, n) == 0) return boiler_cache[h].answer;
    int answer = boiler_key_of(tok, n);
    boiler_cache[h].len = (uchar)n;
    boiler_cache[h].answer = (uchar)answer;
    memcpy(boiler_cache[h].tok, tok, n);
    return answer;
}

static int boiler_key_of(const uchar *tok, size_t n) {
    char t[81];
    if (n < 1 || n > 80) return 0;
    for (size_t i = 0; i < n; i++) {
        uchar c = lower(tok[i]);
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return 0;
        t[i] = (char)c;
    }
    if (in_set(&W_WHOLE, t, n) || (n >= 6 && memmem(t, n, "header", 6) && header_token(t, n))) return 1;
    const char *part[80];
    size_t plen[80], np = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && (t[i] == '-' || t[i] == '_')) i++;
        size_t s = i;
        while (i < n && t[i] != '-' && t[i] != '_') i++;
        if (i > s) {
            part[np] = t + s;
            plen[np++] = i - s;
        }
    }
    if (!np || in_set(&W_STATE_LAST, part[np - 1], plen[np - 1])) return 0;
    for (size_t i = 0; i < np; i++)
        if (in_set(&W_STATE, part[i], plen[i])) return 0;
    for (size_t i = 0; i < np; i++)
        if (in_set(&W_PARTS, part[i], plen[i])) return 1;
    return 0;
}

/* Calls fn(word) for each whitespace-separated word of an ASCII value (str.split()); 1 if any says 1. */
static int any_word(const uchar *v, size_t n, int (*fn)(const uchar *, size_t)) {
    for (size_t i = 0; i < n;) {
        while (i < n && is_ws(v[i])) i++;
        size_t s = i;
        while (i < n && !is_ws(v[i])) i++;
        if (i > s && fn(v + s, i - s)) return 1;
    }
    return 0;
}

static int word_is(const uchar *w, size_t n, const char *want) {
    size_t m = strlen(want);
    if (n != m) return 0;
    for (size_t i = 0; i < n; i++)
        if (lower(w[i]) != (uchar)want[i]) return 0;
    return 1;
}
static int role_main(const uchar *w, size_t n) { return word_is(w, n, "main"); }
static int role_boiler(const uchar *w, size_t n) {
    char t[64];
    if (n >= sizeof(t)) return 0;
    for (size_t i = 0; i < n; i++) t[i] = (char)lower(w[i]);
    return in_set(&W_ROLES, t, n);
}

/* _HIDDEN_STYLE.search: display\s*:\s*none|visibility\s*:\s*hidden, any case */
static int hidden_style(const uchar *v, size_t n) {
    static const char *const keys[2][2] = {{"display", "none"}, {"visibility", "hidden"}};
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            size_t a = strlen(keys[k][0]), b = strlen(keys[k][1]), j = i;
            if (n - j < a || !word_is(v + j, a, keys[k][0])) continue;
            j += a;
            while (j < n && is_ws(v[j])) j++;
            if (j >= n || v[j] != ':') continue;
            j++;
            while (j < n && is_ws(v[j])) j++;
            if (n - j >= b && word_is(v + j, b, keys[k][1])) return 1;
        }
    return 0;
}

typedef struct {
    const uchar *v;
    size_t n;
    int set; /* 0 absent, 1 present without a value (None), 2 with a value */
} attr_val;

/* n.attributes as selectolax builds it (qualified names, values or None, a later name wins). */
static PyObject *attr_dict(node_t *el) {
    PyObject *d = PyDict_New();
    for (attr_t *a = lx_first_attr(el); d && a; a = lx_next_attr(a)) {
        size_t kl = 0, vl = 0;
        const uchar *k = lx_attr_name(a, &kl);
        PyObject *key = PyUnicode_DecodeUTF8((const char *)k, k ? (Py_ssize_t)kl : 0, "replace");
        const uchar *v = lx_attr_value(a, &vl);
        PyObject *val = v ? PyUnicode_DecodeUTF8((const char *)v, (Py_ssize_t)vl, "replace") : Py_NewRef(Py_None);
        if (!key || !val || PyDict_SetItem(d, key, val) < 0) Py_CLEAR(d);
        Py_XDECREF(key);
        Py_XDECREF(val);
    }
    return d;
}

/* _attr_verdict(n.attributes): 0 keep, 1 boilerplate/hidden, 2 role=main; -1 error; -2 no attributes. */
static int verdict(node_t *el) {
    enum { ROLE, CLASS, ID, HIDDEN, ARIA, STYLE, N_ATTRS };
    attr_val at[N_ATTRS];
    for (int i = 0; i < N_ATTRS; i++) at[i].set = 0, at[i].n = 0, at[i].v = NULL;
    int any = 0, plain = 1;
    for (attr_t *a = lx_first_attr(el); a; a = lx_next_attr(a)) {
        size_t kl = 0, vl = 0;
        const uchar *k = lx_attr_name(a, &kl);
        any = 1;
        int i = -1;
        if (k) switch (kl) { /* (the names the rules read, by length first) */
            case 2: i = memcmp(k, "id", 2) ? -1 : ID; break;
            case 4: i = memcmp(k, "role", 4) ? -1 : ROLE; break;
            case 5: i = !memcmp(k, "class", 5) ? CLASS : !memcmp(k, "style", 5) ? STYLE : -1; break;
            case 6: i = memcmp(k, "hidden", 6) ? -1 : HIDDEN; break;
            case 11: i = memcmp(k, "aria-hidden", 11) ? -1 : ARIA; break;
            }
        if (i >= 0) {
            const uchar *v = lx_attr_value(a, &vl);
            at[i] = (attr_val){v, v ? vl : 0, v ? 2 : 1};
        }
    }
    if (!any) return -2;
    for (int i = 0; i < N_ATTRS; i++)
        if (at[i].set == 2 && !is_ascii(at[i].v, at[i].n)) plain = 0;
    if (!plain) { /* Unicode lower()/split(): text.py decides */
        PyObject *d = attr_dict(el);
        if (!d) return -1;
        PyObject *r = PyObject_CallOneArg(py_verdict, d);
        Py_DECREF(d);
        if (!r) return -1;
        long v = PyLong_AsLong(r);
        Py_DECREF(r);
        return (v == -1 && PyErr_Occurred()) ? -1 : (int)v;
    }
    if (at[ROLE].set) {
        if (any_word(at[ROLE].v, at[ROLE].n, role_main)) return 2;
        if (any_word(at[ROLE].v, at[ROLE].n, role_boiler)) return 1;
    }
    if (at[CLASS].n && any_word(at[CLASS].v, at[CLASS].n, boiler_key)) return 1;
    if (at[ID].n && boiler_key(at[ID].v, at[ID].n)) return 1;
    if (at[HIDDEN].set && !word_is(at[HIDDEN].v, at[HIDDEN].n, "until-found")) return 1;
    if (at[ARIA].set) {
        const uchar *v = at[ARIA].v;
        size_t s = 0, e = at[ARIA].n;
        while (s < e && is_ws(v[s])) s++;
        while (e > s && is_ws(v[e - 1])) e--;
        if (word_is(v + s, e - s, "true")) return 1;
    }
    if (at[STYLE].n && hidden_style(at[STYLE].v, at[STYLE].n)) return 1;
    return 0;
}

/* _boiler_key(n.tag or "") is not None, for a custom element; -1 error. */
static int custom_boiler(node_t *el) {
    size_t n = 0;
    const uchar *name = lx_elem_name(el, &n);
    if (!name) n = 0;
    if (is_ascii(name, n)) return boiler_key(name, n);
    PyObject *s = PyUnicode_DecodeUTF8((const char *)name, (Py_ssize_t)n, "replace");
    if (!s) return -1;
    PyObject *r = PyObject_CallOneArg(py_boiler_key, s);
    Py_DECREF(s);
    if (!r) return -1;
    int v = r != Py_None;
    Py_DECREF(r);
    return v;
}

static node_t *ancestor(node_t *n, const uintptr_t *stop, int nstop) {
    for (node_t *p = lx_parent(n); p; p = lx_parent(p)) {
        uintptr_t t = lx_tag_id(p);
        for (int i = 0; i < nstop; i++)
            if (t == stop[i]) return p;
    }
    return NULL;
}

/* ---------------------------------------------------------------- normalize_text's first steps */
/* text.replace("\n"/"\t"/"\r"/"\xa0", " ") and "  +" -> " ", on the UTF-8 bytes (a C2 A0 pair is always
 * U+00A0 in a "replace" decode, and ASCII bytes always stand for themselves, so this is exact).  Returns
 * (text, done, rare): for an ASCII text, the rest of normalize_text's ASCII branch has run (done); else
 * rare is what normalize_text would compute next, the text's UTF-8 bytes without printable ASCII, or
 * None if the bytes were not valid UTF-8 (a "replace" decode changes them). */
/* The high bit of each byte of x that is 0, exactly (the low 7 bits are added without a carry out of
 * their byte), and no other bit: the 8-byte tests below on x ^ (a byte repeated). */
static inline uint64_t zero_bytes(uint64_t x) {
    const uint64_t lows = 0x7f7f7f7f7f7f7f7full;
    return ~(((x & lows) + lows) | x | lows);
}

static uchar space_map[256];  /* \n \t \r -> space, any other byte itself */
static uchar byte_class[256]; /* 1: >= 0x80, 2: a control but \n \t \r, 4: 0xC2 (maybe a C2 A0 pair) */
static uchar is_rare[256];    /* not printable ASCII (nor a space) */

static PyObject *collapse(buf *s, buf *rare_bytes) {
    uchar *b = s->b;
    size_t w = 0, n_in = s->n, nr = 0;
    unsigned flags = 0;
    uchar prev = 0;
    rare_bytes->n = 0;
    if (put(rare_bytes, NULL, n_in) < 0) return NULL; /* room for every byte; filled below */
    uchar *rb = rare_bytes->b;
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (size_t r = 0; r < n_in; r++) {
        while (r + 8 <= n_in) { /* 8 bytes of printable ASCII, no two spaces together: as they are */
            uint64_t x, sp;
            memcpy(&x, b + r, 8);
            uint64_t v = x ^ (ones * ' '), del = x ^ (ones * 0x7f);
            if ((x | ((x - ones * 0x20) & ~x) | ((del - ones) & ~del)) & highs) break; /* >= 0x80, < 0x20, 0x7f */
            sp = zero_bytes(v); /* the high bit of each space byte */
            if (sp & ((sp << 8) | (uint64_t)(prev == ' ') << 7)) break;
            memmove(b + w, b + r, 8);
            w += 8;
            r += 8;
            prev = (uchar)(x >> 56);
        }
        if (r >= n_in) break;
        uchar c = b[r]; /* one byte, branch-free but for C2 */
        unsigned k = byte_class[c];
        if (k & 4 && r + 1 < n_in && b[r + 1] == 0xA0) {
            r++;
            c = ' ', k = 0;
        }
        uchar m = space_map[c];
        flags |= k;
        b[w] = m;
        w += !(m == ' ' && prev == ' ');
        prev = m;
        rb[nr] = m;
        nr += is_rare[m];
    }
    rare_bytes->n = nr;
    int ascii = !(flags & 1), printable = !(flags & 2);
    if (!ascii) {
        /* Without the spaces at its ends (text.py's strip() would copy it for them; an ASCII space at an
         * end is stripped there whatever follows it, so the text comes out the same). */
        uchar *t = b;
        while (w && *t == ' ') t++, w--;
        while (w && t[w - 1] == ' ') w--;
        PyObject *text = PyUnicode_DecodeUTF8((const char *)t, (Py_ssize_t)w, NULL);
        if (text) /* valid UTF-8: its bytes are the text's encoding */
            return Py_BuildValue("(NOy#)", text, Py_False, (const char *)rare_bytes->b, (Py_ssize_t)rare_bytes->n);
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
        PyErr_Clear();
        text = PyUnicode_DecodeUTF8((const char *)t, (Py_ssize_t)w, "replace");
        return text ? Py_BuildValue("(NOO)", text, Py_False, Py_None) : NULL;
    }
    size_t n = w;
    if (!printable) { /* " ".join(_JUNK.sub("", text).split()) */
        size_t o = 0;
        int gap = 0;
        for (size_t r = 0; r < w; r++) {
            uchar c = b[r];
            if (c <= 0x08 || (c >= 0x0e && c <= 0x1b) || c == 0x7f) continue;
            if (is_ws(c)) {
                gap = o > 0;
                continue;
            }
            if (gap) b[o++] = ' ';
            gap = 0;
            b[o++] = c;
        }
        n = o;
    }
    size_t a = 0;
    while (a < n && b[a] == ' ') a++;
    while (n > a && b[n - 1] == ' ') n--;
    PyObject *out = PyUnicode_New((Py_ssize_t)(n - a), 127);
    if (out && n > a) memcpy(PyUnicode_DATA(out), b + a, n - a);
    return out ? Py_BuildValue("(NOO)", out, Py_True, Py_None) : NULL;
}

/* ---------------------------------------------------------------- the walk */
/* text.py's first loop, over `tree.css("*")`: every element in document order, the root among them.
 * The Python walk lists them all before it changes the tree; here the tree is walked as it changes,
 * which meets the same elements in the same order: a removed element (always dropped) is walked on
 * into, and left for where its next sibling was.  The spaces text.py inserts around blocks are not
 * inserted (gather_text gives them: spaced_tag).
 * cands: the elements to drop, their pointer's low bit set if by their attributes. */
static int first_pass(node_t *root, nodes *cands, nodes *mains, nodes *articles) {
    struct removed {
        node_t *e, *next, *parent;
    } *rm = NULL;
    Py_ssize_t n_rm = 0, cap_rm = 0;
    int ok = -1;
    node_t *n = root;
    while (n) {
        if (lx_type(n) == NODE_ELEMENT) {
            uintptr_t t = lx_tag_id(n);
            int k;
            if (t >= 0x10000) { /* custom element: a block, or a semantic drop by its name */
                int b = custom_boiler(n);
                if (b < 0) goto out;
                k = b ? 3 : 1;
            } else
                k = (Py_ssize_t)t < n_kinds ? kinds[t] : 0;
            if (k == 2) {
                if (n_rm == cap_rm) {
                    cap_rm = cap_rm ? cap_rm * 2 : 16;
                    struct removed *grown = PyMem_Realloc(rm, cap_rm * sizeof(*rm));
                    if (!grown) {
                        PyErr_NoMemory();
                        goto out;
                    }
                    rm = grown;
                }
                rm[n_rm++] = (struct removed){n, lx_next(n), lx_parent(n)};
                lx_remove(n);
            } else if (k) {
                int v = -2;
                if (k == 3) {
                    if (push(cands, n) < 0) goto out;
                } else if ((v = verdict(n)) == -1)
                    goto out;
                else if (v != -2) {
                    if (v == 2 || t == T_MAIN) {
                        if (push(mains, n) < 0) goto out;
                    } else if (k == 4) {
                        if (push(articles, n) < 0) goto out;
                    } else if (v && push(cands, (node_t *)((uintptr_t)n | 1)) < 0)
                        goto out;
                } else if (k == 4 && push(t == T_MAIN ? mains : articles, n) < 0)
                    goto out;
            }
        }
        node_t *c = lx_first_child(n);
        if (c) {
            n = c;
            continue;
        }
        for (;;) { /* n's subtree is done: on to the next node in document order */
            if (n == root) {
                n = NULL;
                break;
            }
            if (n_rm && n == rm[n_rm - 1].e) { /* out of a removed element: where it was */
                struct removed r = rm[--n_rm];
                if (r.next) {
                    n = r.next;
                    break;
                }
                n = r.parent;
                continue;
            }
            node_t *next = lx_next(n);
            if (next) {
                n = next;
                break;
            }
            n = lx_parent(n);
        }
    }
    ok = 0;
out:
    PyMem_Free(rm);
    return ok;
}

/* The text's bytes and its rare bytes: buffers kept between calls, for a walk not entered while
 * another is under way (in another thread, while that one called into text.py); such a walk has
 * its own. */
static buf kept_text, kept_rare;
static int walking;

static PyObject *walk(PyObject *self, PyObject *args) {
    unsigned long long root_id, head_id;
    if (text_offset < 0) {
        PyErr_SetString(PyExc_RuntimeError, "_html_walk.init() has not run");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "KK", &root_id, &head_id)) return NULL;
    node_t *root = (node_t *)(uintptr_t)root_id, *head = (node_t *)(uintptr_t)head_id;
    node_t *doc = lx_parent(root);
    if (!doc) {
        PyErr_SetString(PyExc_ValueError, "the root element has no document");
        return NULL;
    }
    nodes cands = {0}, mains = {0}, articles = {0}, forms = {0};
    ptrset protected = {0};
    PyObject *result = NULL;
    const uintptr_t stop[4] = {T_HTML, T_BODY, T_MAIN, T_ARTICLE};
    buf own_text = {0}, own_rare = {0};
    int kept = walking++ == 0;
    buf *scratch = kept ? &kept_text : &own_text, *rare = kept ? &kept_rare : &own_rare;

    if (head) lx_remove(head);
    if (first_pass(root, &cands, &mains, &articles) < 0) goto done;
    nodes *anchors = mains.n ? &mains : &articles;
    for (Py_ssize_t i = 0; i < anchors->n; i++)
        if (set_add(&protected, anchors->a[i]) < 0) goto done;
    for (Py_ssize_t i = 0; cands.n && i < anchors->n; i++)
        for (node_t *p = lx_parent(anchors->a[i]); p && !set_has(&protected, p); p = lx_parent(p))
            if (set_add(&protected, p) < 0) goto done;
    Py_ssize_t total = -1;
    for (Py_ssize_t i = 0; i < cands.n; i++) {
        node_t *n = (node_t *)((uintptr_t)cands.a[i] & ~(uintptr_t)1);
        uintptr_t t = lx_tag_id(n);
        if ((uintptr_t)cands.a[i] & 1) { /* dropped by its attributes */
            if (set_has(&protected, n) || t == T_HTML || t == T_BODY || t == T_MAIN || t == T_ARTICLE) continue;
            if (!anchors->n && (Py_ssize_t)t < n_kinds && wrappers[t]) { /* never take half the page */
                Py_ssize_t size = text_len(n, scratch);
                if (size < 0) goto done;
                if (total < 0 && size > 500 && (total = text_len(root, scratch)) < 0) goto done;
                if (size > 500 && total >= 0 && size * 2 > total) continue;
            }
        } else if (t == T_FORM) {
            if (push(&forms, n) < 0) goto done;
            continue;
        } else if (t == T_HEADER) {
            node_t *a = ancestor(n, stop, 4);
            uintptr_t at = lx_tag_id(a ? a : root);
            if (at == T_MAIN || at == T_ARTICLE) continue; /* an article's header holds its title */
        }
        if (remove_spaced(doc, n) < 0) goto done;
    }
    for (Py_ssize_t i = 0; i < forms.n; i++) { /* search/login forms go; one wrapping the page stays */
        node_t *f = forms.a[i];
        if (set_has(&protected, f) || !ancestor(f, stop, 1)) continue;
        Py_ssize_t size = text_len(f, scratch);
        if (size < 0) goto done;
        if (size < 1000 && !has_element(f, T_H1, T_H2, T_MAIN, T_ARTICLE) && remove_spaced(doc, f) < 0) goto done;
    }
    scratch->n = 0;
    if (gather_text(root, scratch) < 0) goto done;
    result = collapse(scratch, rare);
done:
    PyMem_Free(cands.a);
    PyMem_Free(mains.a);
    PyMem_Free(articles.a);
    PyMem_Free(forms.a);
    PyMem_Free(protected.slot);
    walking--;
    for (int i = 0; i < 2; i++) { /* keep a page's worth of buffer between calls, not a huge one's */
        buf *b = i ? rare : scratch;
        if (!kept || b->cap > (16u << 20)) {
            PyMem_Free(b->b);
            *b = (buf){0};
        }
    }
    return result;
}

/* ---------------------------------------------------------------- text.py's _flatten_deep check */
static int cmp_key(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* What nesting() makes of the keys it was last given: */
static PyObject *nesting_keys; /* the keys last given, and what was made of them: */
static long *sorted_keys;
static Py_ssize_t n_keys;
static uint64_t key_heads[1024]; /* a bit per key >> 8 (its first two bytes) */

static int load_keys(PyObject *keys_obj) {
    if (keys_obj == nesting_keys) return 0;
    PyObject *fast = PySequence_Fast(keys_obj, "keys: a sequence of int");
    if (!fast) return -1;
    Py_ssize_t nk = PySequence_Fast_GET_SIZE(fast);
    long *keys = PyMem_Malloc((nk ? nk : 1) * sizeof(long));
    if (!keys) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nk; i++) keys[i] = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    Py_DECREF(fast);
    for (Py_ssize_t i = 0; i < nk; i++)
        if (keys[i] < 0 || keys[i] >= (1L << 24)) {
            PyMem_Free(keys);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "keys are 3-byte ints");
            return -1;
        }
    qsort(keys, nk, sizeof(long), cmp_key);
    memset(key_heads, 0, sizeof(key_heads));
    for (Py_ssize_t i = 0; i < nk; i++) key_heads[keys[i] >> 14] |= 1ull << ((keys[i] >> 8) & 63);
    PyMem_Free(sorted_keys);
    sorted_keys = keys;
    n_keys = nk;
    Py_XSETREF(nesting_keys, Py_NewRef(keys_obj));
    return 0;
}

/* The number of '<' in a[0..n), eight bytes at a time. */
static Py_ssize_t count_lt(const uchar *a, Py_ssize_t n) {
    Py_ssize_t count = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, a + i, 8);
        uint64_t z = zero_bytes(x ^ 0x3c3c3c3c3c3c3c3cull); /* the '<' bytes */
        count += (Py_ssize_t)(((z >> 7) * 0x0101010101010101ull) >> 56); /* its bytes (0 or 1) summed */
    }
    for (; i < n; i++) count += a[i] == '<';
    return count;
}

/* nesting(data, keys, min_count=0) -> (data.count(b"<"), the deepest nesting of the tags whose 3-byte key
 * is in keys, or 0 if none or if the count is below min_count): the numpy computation of text.py's
 * _flatten_deep in one pass.  (The count alone is ~5 x faster than the walk over every '<'.) */
static PyObject *nesting(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *keys_obj;
    Py_ssize_t min_count = 0;
    if (!PyArg_ParseTuple(args, "y*O|n", &data, &keys_obj, &min_count)) return NULL;
    if (min_count > 0) {
        Py_ssize_t count = count_lt(data.buf, data.len);
        if (count < min_count) {
            PyBuffer_Release(&data);
            return Py_BuildValue("(nl)", count, 0L);
        }
    }
    if (load_keys(keys_obj) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const uchar *a = data.buf;
    Py_ssize_t n = data.len, count = 0;
    long depth = 0, deepest = LONG_MIN;
    for (const uchar *p = a; (p = memchr(p, '<', a + n - p)) != NULL; p++) {
        count++;
        Py_ssize_t lt = p - a;
        if (lt >= n - 4) continue; /* (the numpy code looks at a[:-4]) */
        int close = a[lt + 1] == '/';
        Py_ssize_t s0 = lt + 1 + close;
        long key = (long)(a[s0] | 32) << 16 | (long)(a[s0 + 1] | 32) << 8 | (a[s0 + 2] | 32);
        if (!((key_heads[key >> 14] >> ((key >> 8) & 63)) & 1)) continue;
        if (!bsearch(&key, sorted_keys, n_keys, sizeof(long), cmp_key)) continue;
        depth += close ? -1 : 1;
        if (depth > deepest) deepest = depth;
    }
    PyBuffer_Release(&data);
    return Py_BuildValue("(nl)", count, deepest == LONG_MIN ? 0L : deepest);
}

/* ---------------------------------------------------------------- normalize_text's junk removal */
static uchar cp_class[0x10000]; /* 1 junk (text.py's _JUNK_RANGES), 2 str.split()'s whitespace; all in the BMP */

static int load_code_points(PyObject *junk, PyObject *spaces) {
    uchar cls[0x10000];
    memset(cls, 0, sizeof(cls));
    PyObject *fast = PySequence_Fast(junk, "junk: (first, last) code point ranges");
    if (!fast) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        unsigned long a, b;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "kk", &a, &b) || a > b || b > 0xFFFF) {
            Py_DECREF(fast);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "junk ranges lie in the BMP");
            return -1;
        }
        for (unsigned long c = a; c <= b; c++) cls[c] = 1;
    }
    Py_DECREF(fast);
    if (!(fast = PySequence_Fast(spaces, "spaces: code points"))) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        long c = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (c < 0 || c > 0xFFFF) {
            Py_DECREF(fast);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "whitespace lies in the BMP");
            return -1;
        }
        if (!cls[c]) cls[c] = 2;
    }
    Py_DECREF(fast);
    memcpy(cp_class, cls, sizeof(cls));
    return 0;
}

/* junk_split(text) -> " ".join(_JUNK.sub("", text).split()), over the code points. */
static PyObject *junk_split(PyObject *self, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "junk_split takes a str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), o = 0;
    int kind = PyUnicode_KIND(text), gap = 0;
    const void *data = PyUnicode_DATA(text);
    Py_UCS4 *out = PyMem_Malloc((n ? n : 1) * sizeof(Py_UCS4));
    if (!out) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        int k = c < 0x10000 ? cp_class[c] : 0;
        if (k == 1) continue; /* (junk goes first: it never splits a word, and spaces around it merge) */
        if (k == 2) {
            gap = o > 0;
            continue;
        }
        if (gap) out[o++] = ' ';
        gap = 0;
        out[o++] = c;
    }
    PyObject *r = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, o);
    PyMem_Free(out);
    return r;
}

/* ---------------------------------------------------------------- init */
static int look_up(void *so, void **fn, const char *name) {
    *fn = dlsym(so, name);
    if (!*fn) PyErr_Format(PyExc_ImportError, "selectolax's lexbor does not export %s", name);
    return *fn ? 0 : -1;
}

/* Finds where a text node keeps its data: a (pointer, length) pair holding the probe's bytes. */
static Py_ssize_t probe_offset(node_t *t, const uchar *want, size_t n) {
    for (Py_ssize_t off = 0; off <= 160; off += sizeof(void *)) {
        size_t len;
        const uchar *d;
        memcpy(&len, (const char *)t + off + sizeof(void *), sizeof(len));
        if (len != n) continue; /* (a node field equal to the probe's odd length is the data's) */
        memcpy(&d, (const char *)t + off, sizeof(d));
        if (d && memcmp(d, want, n) == 0) return off;
    }
    return -1;
}

/* The one offset (a multiple of `step`, below 128) at which every sample node holds what `want` gives. */
static Py_ssize_t find_offset(nodes *sample, uintptr_t (*want)(node_t *), Py_ssize_t step, int as_int) {
    Py_ssize_t found = -1;
    for (Py_ssize_t off = 0; off + (Py_ssize_t)sizeof(void *) <= 128; off += step) {
        int all = 1;
        for (Py_ssize_t i = 0; all && i < sample->n; i++) {
            node_t *n = sample->a[i];
            uintptr_t v;
            if (as_int) {
                int t;
                memcpy(&t, (const char *)n + off, sizeof(t));
                v = (uintptr_t)(unsigned)t;
            } else
                memcpy(&v, (const char *)n + off, sizeof(v));
            all = v == want(n);
        }
        if (all) {
            if (found >= 0) return -1; /* not unique: the sample cannot tell */
            found = off;
        }
    }
    return found;
}
static uintptr_t want_first_child(node_t *n) { return (uintptr_t)noi_first_child(n); }
static uintptr_t want_next(node_t *n) { return (uintptr_t)noi_next(n); }
static uintptr_t want_prev(node_t *n) { return (uintptr_t)noi_prev(n); }
static uintptr_t want_parent(node_t *n) { return (uintptr_t)noi_parent(n); }
static uintptr_t want_tag_id(node_t *n) { return noi_tag_id(n); }
static uintptr_t want_type(node_t *n) { return (uintptr_t)(unsigned)noi_type(n); }

/* Finds the node fields on a sample tree (every node under `root`, by lexbor's functions). */
static void find_fields(node_t *root) {
    nodes sample = {0};
    node_t *n = root;
    direct = 0;
    for (;;) {
        if (push(&sample, n) < 0) {
            PyErr_Clear();
            break;
        }
        node_t *c = noi_first_child(n);
        if (c) {
            n = c;
            continue;
        }
        while (n != root && !noi_next(n)) n = noi_parent(n);
        if (n == root) break;
        n = noi_next(n);
    }
    if (sample.n >= 8) {
        off_first_child = find_offset(&sample, want_first_child, sizeof(void *), 0);
        off_next = find_offset(&sample, want_next, sizeof(void *), 0);
        off_prev = find_offset(&sample, want_prev, sizeof(void *), 0);
        off_parent = find_offset(&sample, want_parent, sizeof(void *), 0);
        off_tag_id = find_offset(&sample, want_tag_id, sizeof(void *), 0);
        off_type = find_offset(&sample, want_type, sizeof(int), 1);
        direct = off_first_child >= 0 && off_next >= 0 && off_prev >= 0 && off_parent >= 0 && off_tag_id >= 0 &&
                 off_type >= 0;
    }
    PyMem_Free(sample.a);
}

static int fields_found;

/* direct_fields([on]) -> whether the walk reads node fields directly (found at init); `on`: switch. */
static PyObject *direct_fields(PyObject *self, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|p", &on)) return NULL;
    if (on >= 0) direct = on && fields_found;
    return PyBool_FromLong(direct);
}

static PyObject *init(PyObject *self, PyObject *args) {
    const char *so_path;
    unsigned long long probe1, probe2, sample;
    Py_buffer want1, want2, kind_table, wrapper_table;
    PyObject *ids, *sets, *verdict_fn, *boiler_fn, *junk, *spaces;
    if (!PyArg_ParseTuple(args, "sKy*Ky*Ky*y*OOOOOO", &so_path, &probe1, &want1, &probe2, &want2, &sample,
                          &kind_table, &wrapper_table, &ids, &sets, &verdict_fn, &boiler_fn, &junk, &spaces))
        return NULL;
    PyObject *ok = NULL;
    void *so = dlopen(so_path, RTLD_NOW | RTLD_NOLOAD);
    if (!so) {
        PyErr_Format(PyExc_ImportError, "selectolax's lexbor module is not loaded: %s", dlerror());
        goto out;
    }
    struct {
        void **fn;
        const char *name;
    } fns[] = {
        {(void **)&noi_first_child, "lxb_dom_node_first_child_noi"},
        {(void **)&noi_next, "lxb_dom_node_next_noi"},
        {(void **)&noi_prev, "lxb_dom_node_prev_noi"},
        {(void **)&noi_parent, "lxb_dom_node_parent_noi"},
        {(void **)&noi_tag_id, "lxb_dom_node_tag_id_noi"},
        {(void **)&noi_type, "lxb_dom_node_type_noi"},
        {(void **)&lx_first_attr, "lxb_dom_element_first_attribute_noi"},
        {(void **)&lx_next_attr, "lxb_dom_element_next_attribute_noi"},
        {(void **)&lx_attr_name, "lxb_dom_attr_qualified_name"},
        {(void **)&lx_attr_value, "lxb_dom_attr_value_noi"},
        {(void **)&lx_elem_name, "lxb_dom_element_qualified_name"},
        {(void **)&lx_remove, "lxb_dom_node_remove"},
        {(void **)&lx_create_text, "lxb_dom_document_create_text_node"},
        {(void **)&lx_insert_before, "lxb_dom_node_insert_before"},
        {(void **)&lx_insert_after, "lxb_dom_node_insert_after"},
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
        if (look_up(so, fns[i].fn, fns[i].name) < 0) goto out;
    find_fields((node_t *)(uintptr_t)sample);
    fields_found = direct;
    Py_ssize_t off = probe_offset((node_t *)(uintptr_t)probe1, want1.buf, (size_t)want1.len);
    if (off < 0 || probe_offset((node_t *)(uintptr_t)probe2, want2.buf, (size_t)want2.len) != off) {
        PyErr_SetString(PyExc_ImportError, "could not find where lexbor keeps a text node's data");
        goto out;
    }
    if (kind_table.len != wrapper_table.len) {
        PyErr_SetString(PyExc_ValueError, "the kind and wrapper tables differ in length");
        goto out;
    }
    unsigned long long id[9];
    if (!PyArg_ParseTuple(ids, "KKKKKKKKK", &id[0], &id[1], &id[2], &id[3], &id[4], &id[5], &id[6], &id[7], &id[8]))
        goto out;
    T_TEXT = id[0], T_HTML = id[1], T_BODY = id[2], T_MAIN = id[3], T_ARTICLE = id[4], T_FORM = id[5];
    T_HEADER = id[6], T_H1 = id[7], T_H2 = id[8];
    wordset *targets[] = {&W_ROLES, &W_PARTS, &W_WHOLE, &W_STATE, &W_STATE_LAST, &W_HPRE, &W_HSUF};
    if (!PyTuple_Check(sets) || PyTuple_GET_SIZE(sets) != 7) {
        PyErr_SetString(PyExc_ValueError, "seven word lists expected");
        goto out;
    }
    for (int i = 0; i < 7; i++)
        if (load_set(targets[i], PyTuple_GET_ITEM(sets, i)) < 0) goto out;
    kinds = PyMem_Malloc(kind_table.len);
    wrappers = PyMem_Malloc(wrapper_table.len);
    if (!kinds || !wrappers) {
        PyErr_NoMemory();
        goto out;
    }
    memcpy(kinds, kind_table.buf, kind_table.len);
    memcpy(wrappers, wrapper_table.buf, wrapper_table.len);
    n_kinds = kind_table.len;
    if (load_code_points(junk, spaces) < 0) goto out;
    Py_XSETREF(py_verdict, Py_NewRef(verdict_fn));
    Py_XSETREF(py_boiler_key, Py_NewRef(boiler_fn));
    for (int c = 0; c < 256; c++) {
        int space = c == '\n' || c == '\t' || c == '\r';
        space_map[c] = space ? ' ' : (uchar)c;
        byte_class[c] = (c >= 0x80) | ((c < 0x20 || c == 0x7f) && !space) << 1 | (c == 0xC2) << 2;
        is_rare[c] = c < 0x20 || c >= 0x7f;
    }
    text_offset = off;
    ok = Py_NewRef(Py_None);
out:
    PyBuffer_Release(&want1);
    PyBuffer_Release(&want2);
    PyBuffer_Release(&kind_table);
    PyBuffer_Release(&wrapper_table);
    return ok;
}

/* For the tests: the C word rules on one ASCII token / attribute set. */
static PyObject *py_boiler(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (!PyArg_Parse(arg, "y*", &b)) return NULL;
    int r = boiler_key(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyBool_FromLong(r);
}

/* ---------------------------------------------------------------- the page's UTF-8 for lexbor */
/* to_utf8(text) -> text.encode("utf-8", "replace"): a lone surrogate becomes "?".  CPython's encoder
 * goes a character at a time; here eight characters of a one-byte text, or four of a two-byte one, are
 * copied at once while they are ASCII (most of a page's markup). */
static inline uchar *put_cp(uchar *o, Py_UCS4 c) {
    if (c < 0x80)
        *o++ = (uchar)c;
    else if (c < 0x800)
        *o++ = (uchar)(0xC0 | c >> 6), *o++ = (uchar)(0x80 | (c & 0x3F));
    else if (c >= 0xD800 && c <= 0xDFFF)
        *o++ = '?';
    else if (c < 0x10000)
        *o++ = (uchar)(0xE0 | c >> 12), *o++ = (uchar)(0x80 | ((c >> 6) & 0x3F)), *o++ = (uchar)(0x80 | (c & 0x3F));
    else
        *o++ = (uchar)(0xF0 | c >> 18), *o++ = (uchar)(0x80 | ((c >> 12) & 0x3F)),
        *o++ = (uchar)(0x80 | ((c >> 6) & 0x3F)), *o++ = (uchar)(0x80 | (c & 0x3F));
    return o;
}

static PyObject *to_utf8(PyObject *self, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "text must be str, not %.80s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (PyUnicode_READY(text) < 0) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    if (PyUnicode_IS_ASCII(text)) return PyBytes_FromStringAndSize((const char *)PyUnicode_DATA(text), n);
    if (n > PY_SSIZE_T_MAX / 4) return PyErr_NoMemory();
    /* room for the worst case, cut to size at the end (as CPython's encoder does) */
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (kind == PyUnicode_1BYTE_KIND ? 2 : kind == PyUnicode_2BYTE_KIND ? 3 : 4));
    if (!out) return NULL;
    uchar *o = (uchar *)PyBytes_AS_STRING(out);
    Py_ssize_t i = 0;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *s = PyUnicode_1BYTE_DATA(text);
        while (i < n) {
            uint64_t x;
            if (i + 8 <= n && (memcpy(&x, s + i, 8), !(x & 0x8080808080808080ull))) {
                memcpy(o, &x, 8);
                o += 8, i += 8;
                continue;
            }
            o = put_cp(o, s[i++]);
        }
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *s = PyUnicode_2BYTE_DATA(text);
        while (i < n) {
            uint64_t x;
            if (i + 4 <= n && (memcpy(&x, s + i, 8), !(x & 0xFF80FF80FF80FF80ull))) {
                /* four code units below 0x80: their low bytes */
                o[0] = (uchar)x, o[1] = (uchar)(x >> 16), o[2] = (uchar)(x >> 32), o[3] = (uchar)(x >> 48);
                o += 4, i += 4;
                continue;
            }
            o = put_cp(o, s[i++]);
        }
    } else {
        const Py_UCS4 *s = PyUnicode_4BYTE_DATA(text);
        for (; i < n; i++) o = put_cp(o, s[i]);
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(o - (uchar *)PyBytes_AS_STRING(out))) < 0) return NULL;
    return out;
}

/* ---------------------------------------------------------------- text.py's _check_text on UTF-8 */
/* content_checks(data, sample_chars, ctrl_table) -> (controls in the first sample_chars code points
 * of the valid UTF-8 `data`, those code points). */
static PyObject *content_checks(PyObject *self, PyObject *args) {
    Py_buffer data, table;
    Py_ssize_t sample;
    if (!PyArg_ParseTuple(args, "y*ny*", &data, &sample, &table)) return NULL;
    if (table.len != 256) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&table);
        PyErr_SetString(PyExc_ValueError, "ctrl_table: 256 bytes, 1 for a control");
        return NULL;
    }
    const uchar *p = data.buf, *ctl = table.buf;
    Py_ssize_t n = data.len, chars = 0, ctrl = 0;
    for (Py_ssize_t i = 0; i < n && chars < sample; i++) {
        uchar c = p[i];
        if ((c & 0xC0) != 0x80) chars++; /* (the bytes are valid UTF-8: a code point per lead byte) */
        ctrl += ctl[c];
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&table);
    return Py_BuildValue("(nn)", ctrl, chars);
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(so_path, probe1, bytes1, probe2, bytes2, sample_root, kinds, wrappers, ids, words, verdict, boiler_key, junk_ranges, spaces)"},
    {"walk", walk, METH_VARARGS, "walk(root_mem_id, head_mem_id) -> (text, done, rare): see collapse()"},
    {"nesting", nesting, METH_VARARGS, "nesting(data, keys, min_count=0) -> (count of '<', deepest nesting of those tags, 0 below min_count)"},
    {"direct_fields", direct_fields, METH_VARARGS, "direct_fields([on]) -> bool: node fields read directly"},
    {"content_checks", content_checks, METH_VARARGS, "content_checks(data, sample_chars, ctrl_table) -> (controls, code points)"},
    {"to_utf8", to_utf8, METH_O, "to_utf8(text) -> text.encode('utf-8', 'replace')"},
    {"junk_split", junk_split, METH_O, "junk_split(text) -> ' '.join(_JUNK.sub('', text).split())"},
    {"boiler_key", py_boiler, METH_O, "boiler_key(token: bytes) -> bool, text.py's _boiler_key(token) is not None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_html_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__html_walk(void) { return PyModule_Create(&module); }
