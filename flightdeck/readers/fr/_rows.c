/* flightdeck.readers.fr._rows: the per-entry pass of `_signature_rows` in C.
 *
 * One pass over a dump's entry dicts reads the fields the summary keeps of every entry and
 * returns them as `flightdeck.readers.fr.signatures._signature_rows_py` does, or None (declined)
 * for anything but the common shape of exact types: then the Python pass reads the same entries
 * and decides (the same result, error or budget refusal). Declining is always safe, so every
 * check here is at least as strict as the Python pass's. The entries are untrusted data from the
 * restricted unpickler (plain dicts, lists, tuples, str, int, float, bool, None); no Python code
 * runs during the pass (only dict lookups with str keys and hashes of str and int tuples), so the
 * entries cannot change under it and borrowed references stay valid.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    F_RID,
    F_SEQ,
    F_CREATED,
    F_OPID,
    F_STATE,
    F_DURATION,
    F_FRAMES,
    F_P2P,
    F_PG,
    F_PROF,
    F_IN,
    F_OUT,
    F_INDT,
    F_OUTDT,
    N_FIELDS
};

static const char *const field_names[N_FIELDS] = {
    "record_id",   "collective_seq_id", "time_created_ns", "op_id",        "state",
    "duration_ms", "frames",            "is_p2p",          "process_group", "profiling_name",
    "input_sizes", "output_sizes",      "input_dtypes",    "output_dtypes",
};

/* Interned field names; made once at import, alive as long as the process. */
static PyObject *field_keys[N_FIELDS];

/* The signature of an entry as object identities (profiling name, sizes and dtypes objects) ->
 * the position of the first entry with an equal key (a value of the `first` dict). The Python
 * pass keys by (profiling name, id() of each of the four), so equal names that are distinct
 * objects meet in `first`; this table only saves building that tuple for an identity seen before. */
typedef struct {
    PyObject *k[5];
    PyObject *at; /* borrowed from `first`; NULL: empty slot */
} slot_t;

typedef struct {
    slot_t *slots;
    size_t mask;
    size_t used;
} table_t;

static size_t
hash5(PyObject *const *k)
{
    uint64_t h = 0x243F6A8885A308D3ULL;
    for (int j = 0; j < 5; j++) {
        h = (h ^ ((uint64_t)(uintptr_t)k[j] >> 4)) * 0x9E3779B97F4A7C15ULL;
    }
    return (size_t)(h ^ (h >> 31));
}

static slot_t *
table_find(table_t *t, PyObject *const *k)
{
    size_t i = hash5(k) & t->mask;
    for (;;) {
        slot_t *s = &t->slots[i];
        if (s->at == NULL || memcmp(s->k, k, sizeof(s->k)) == 0) {
            return s;
        }
        i = (i + 1) & t->mask;
    }
}

static int
table_grow(table_t *t)
{
    size_t old_size = t->mask + 1, size = old_size * 2;
    slot_t *old = t->slots, *slots = PyMem_Calloc(size, sizeof(slot_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->slots = slots;
    t->mask = size - 1;
    for (size_t i = 0; i < old_size; i++) {
        if (old[i].at != NULL) {
            *table_find(t, old[i].k) = old[i];
        }
    }
    PyMem_Free(old);
    return 0;
}

/* The key tuple of the Python pass, (profiling name, id(input sizes), ...), or NULL. */
static PyObject *
python_key(PyObject *const *k)
{
    PyObject *key = PyTuple_New(5);
    if (key == NULL) {
        return NULL;
    }
    Py_INCREF(k[0]);
    PyTuple_SET_ITEM(key, 0, k[0]);
    for (int j = 1; j < 5; j++) {
        PyObject *id = PyLong_FromVoidPtr(k[j]); /* what id() returns */
        if (id == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SET_ITEM(key, j, id);
    }
    return key;
}

/* The first entry's keys in its order, as object identities, and the field each one is (or -1).
 * The unpickler shares one str object for each key of all entries (the pickle memoizes it), and
 * entries made alike have their keys in the same order: an entry whose keys are these very objects
 * in this order has its fields at these positions, read by one walk (`PyDict_Next`) instead of a
 * lookup per field (125 instructions each, callgrind). Any other entry is read by lookups. */
#define MAX_LAYOUT 64

typedef struct {
    Py_ssize_t len; /* -1: no layout (the first entry has more keys than MAX_LAYOUT) */
    PyObject *key[MAX_LAYOUT]; /* borrowed: the first entry holds them throughout the pass */
    signed char field[MAX_LAYOUT];
} layout_t;

static void
layout_of(PyObject *e, layout_t *lay)
{
    Py_ssize_t pos = 0, j = 0;
    PyObject *k, *v;
    lay->len = PyDict_GET_SIZE(e);
    if (lay->len > MAX_LAYOUT) {
        lay->len = -1;
        return;
    }
    while (PyDict_Next(e, &pos, &k, &v)) {
        lay->key[j] = k;
        lay->field[j] = -1;
        for (int f = 0; PyUnicode_CheckExact(k) && f < N_FIELDS; f++) {
            if (PyUnicode_Compare(k, field_keys[f]) == 0) {
                lay->field[j] = (signed char)f;
                break;
            }
        }
        j++;
    }
}

/* The entry's fields by the layout into v (NULL where it has none); 0 where its keys are not the
 * layout's. */
static int
fields_by_layout(PyObject *e, const layout_t *lay, PyObject **v)
{
    Py_ssize_t pos = 0, j = 0;
    PyObject *k, *value;
    if (PyDict_GET_SIZE(e) != lay->len) {
        return 0;
    }
    /* As many items as the layout has: no call to learn that there are no more. */
    while (j < lay->len && PyDict_Next(e, &pos, &k, &value)) {
        if (k != lay->key[j]) {
            return 0;
        }
        if (lay->field[j] >= 0) {
            v[lay->field[j]] = value;
        }
        j++;
    }
    return 1;
}

/* `fields_by_layout` without `PyDict_Next`: the entry's items read straight from its key table.
 *
 * An entry dict the unpickler builds is a combined table whose keys are all str (CPython's
 * "unicode" kind) and that has had nothing deleted: its items are an array of (key, value)
 * pairs in insertion order. The first entry's array gives the layout (its key objects in order,
 * and which field each is); an entry whose array holds as many items, none deleted, with the
 * very same key objects at every position has the same keys, so its fields are at the layout's
 * positions and the fields the first entry lacks are missing from it too. That is one pointer
 * compare per item instead of a `PyDict_Next` call (53 instructions each, callgrind: 13.4
 * million of the pass's 23.8 million per six 2,000-entry files). Any other entry (a split or
 * general table, a deleted item, another length, another key object anywhere) is read by
 * `fields_by_layout` or by lookups as before, so the values are those either gives.
 *
 * The key table's layout is CPython's own (Include/internal/pycore_dict.h), the same in 3.11
 * and 3.12: built only for those, and used only once `peek_works` has read a dict made at import
 * this way and found its values where lookups find them. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000 && !defined(Py_GIL_DISABLED)
#define PEEK_BUILT 1
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind;
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} peek_keys_t;

typedef struct {
    PyObject *me_key;
    PyObject *me_value;
} peek_item_t;

enum { PEEK_UNICODE_KIND = 1 };
#endif

/* Whether the key-table read is used (set at import by `peek_works`). */
static int peek_on = 0;

typedef struct {
    Py_ssize_t len; /* -1: entries are not read this way (then every entry is read as before) */
    PyObject *key[MAX_LAYOUT]; /* borrowed: the first entry holds them throughout the pass */
    signed char field[MAX_LAYOUT];
} peek_t;

#ifdef PEEK_BUILT
/* The items of a combined all-str table with nothing deleted, and how many; NULL for any other. */
static peek_item_t *
peek_items(PyObject *e, Py_ssize_t *n)
{
    PyDictObject *d = (PyDictObject *)e;
    if (d->ma_values != NULL) {
        return NULL;
    }
    peek_keys_t *k = (peek_keys_t *)d->ma_keys;
    if (k->dk_kind != PEEK_UNICODE_KIND || k->dk_nentries != d->ma_used ||
        k->dk_log2_index_bytes >= 8 * sizeof(size_t)) {
        return NULL;
    }
    *n = k->dk_nentries;
    return (peek_item_t *)(k->dk_indices + ((size_t)1 << k->dk_log2_index_bytes));
}
#endif

/* The layout of the first entry, when `peek_items` reads it. */
static void
peek_of(PyObject *e, peek_t *pk)
{
    pk->len = -1;
#ifdef PEEK_BUILT
    Py_ssize_t n = 0;
    peek_item_t *items = peek_on ? peek_items(e, &n) : NULL;
    if (items == NULL || n > MAX_LAYOUT) {
        return;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *k = items[j].me_key;
        if (k == NULL || items[j].me_value == NULL || !PyUnicode_CheckExact(k)) {
            return;
        }
        pk->key[j] = k;
        pk->field[j] = -1;
        for (int f = 0; f < N_FIELDS; f++) {
            if (PyUnicode_Compare(k, field_keys[f]) == 0) {
                pk->field[j] = (signed char)f;
                break;
            }
        }
    }
    pk->len = n;
#else
    (void)e;
#endif
}

/* The entry's fields by `pk` into v (NULL where it has none); 0 where it is not read this way
 * (v is then unchanged). */
static int
fields_by_peek(PyObject *e, const peek_t *pk, PyObject **v)
{
#ifdef PEEK_BUILT
    Py_ssize_t n = 0;
    peek_item_t *items = pk->len >= 0 ? peek_items(e, &n) : NULL;
    if (items == NULL || n != pk->len) {
        return 0;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (items[j].me_key != pk->key[j] || items[j].me_value == NULL) {
            return 0;
        }
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (pk->field[j] >= 0) {
            v[pk->field[j]] = items[j].me_value;
        }
    }
    return 1;
#else
    (void)e;
    (void)pk;
    (void)v;
    return 0;
#endif
}

/* Whether `fields_by_peek` reads a dict made as the unpickler makes one (keys inserted in turn)
 * as lookups do: the check at import that this CPython lays its tables out as assumed. */
static int
peek_works(void)
{
#ifdef PEEK_BUILT
    PyObject *d = PyDict_New();
    int ok = d != NULL;
    for (int f = 0; ok && f < N_FIELDS; f++) {
        PyObject *k = PyUnicode_FromString(field_names[f]); /* not the interned ones */
        PyObject *val = PyLong_FromLong(1000 + f);
        ok = k && val && PyDict_SetItem(d, k, val) == 0;
        Py_XDECREF(k);
        Py_XDECREF(val);
    }
    if (ok) {
        peek_t pk;
        PyObject *v[N_FIELDS];
        memset(v, 0, sizeof(v));
        peek_on = 1;
        peek_of(d, &pk);
        ok = pk.len == N_FIELDS && fields_by_peek(d, &pk, v);
        for (int f = 0; ok && f < N_FIELDS; f++) {
            ok = v[f] == PyDict_GetItemWithError(d, field_keys[f]);
        }
        peek_on = 0;
    }
    Py_XDECREF(d);
    PyErr_Clear();
    return ok;
#else
    return 0;
#endif
}

/* An exact int within 64 bits into *out; 0 when it is not one (declined). */
static int
int64_of(PyObject *v, long long *out)
{
    int overflow = 0;
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow;
}

PyDoc_STRVAR(signature_rows_doc,
             "signature_rows(entries, states, max_frames, /)\n--\n\n"
             "The per-entry columns of `_signature_rows_py` of a list of entry dicts, or None\n"
             "where the Python pass must decide (see flightdeck/readers/fr/signatures.py).");

static PyObject *
signature_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyLong_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "signature_rows(list, dict, int)");
        return NULL;
    }
    PyObject *entries = args[0], *states = args[1];
    Py_ssize_t max_frames = PyLong_AsSsize_t(args[2]);
    if (max_frames == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(entries);
    if (n == 0 || n > PY_SSIZE_T_MAX / 8) {
        Py_RETURN_NONE;
    }
    PyObject *result = NULL, *seq_b = NULL, *created_b = NULL, *op_b = NULL, *key_of = NULL;
    PyObject *first = NULL, *groups = NULL, *descs = NULL, *index = NULL, *framed = NULL;
    Py_ssize_t *fpos = NULL, n_framed = 0;
    PyObject *group_of = NULL, *is_p2p = NULL;
    Py_ssize_t *gidx = NULL;
    char *p2p = NULL;
    table_t table = {NULL, 63, 0};
    int declined = 0, any_p2p = 0, seq_increasing = 1;
    Py_ssize_t n_frames = 0;

    seq_b = PyBytes_FromStringAndSize(NULL, n * 8);
    created_b = PyBytes_FromStringAndSize(NULL, n * 8);
    op_b = PyBytes_FromStringAndSize(NULL, n * 8);
    key_of = PyList_New(n);
    first = PyDict_New();
    groups = PyList_New(0);
    descs = PyDict_New();
    index = PyDict_New();
    gidx = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    fpos = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    p2p = PyMem_Malloc((size_t)n);
    table.slots = PyMem_Calloc(table.mask + 1, sizeof(slot_t));
    if (!(seq_b && created_b && op_b && key_of && first && groups && descs && index)) {
        goto error;
    }
    if (!(gidx && fpos && p2p && table.slots)) {
        PyErr_NoMemory();
        goto error;
    }
    int64_t *seq = (int64_t *)PyBytes_AS_STRING(seq_b);
    int64_t *created = (int64_t *)PyBytes_AS_STRING(created_b);
    int64_t *op_id = (int64_t *)PyBytes_AS_STRING(op_b);
    long long prev_rid = 0;
    PyObject *last_state = NULL, *last_pg = NULL;
    Py_ssize_t last_gi = 0;
    layout_t layout;
    peek_t peek;

    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(entries)) {
            goto decline; /* cannot happen with plain data (no code runs); cheap to rule out */
        }
        PyObject *e = PyList_GET_ITEM(entries, i);
        PyObject *v[N_FIELDS];
        if (!PyDict_CheckExact(e)) {
            goto decline;
        }
        if (i == 0) {
            layout_of(e, &layout);
            peek_of(e, &peek);
        }
        memset(v, 0, sizeof(v));
        int by_layout = fields_by_peek(e, &peek, v) || fields_by_layout(e, &layout, v);
        if (!by_layout) {
            memset(v, 0, sizeof(v));
        }
        for (int f = 0; f < N_FIELDS; f++) {
            if (v[f] == NULL && !by_layout) {
                v[f] = PyDict_GetItemWithError(e, field_keys[f]);
                if (v[f] == NULL && PyErr_Occurred()) {
                    goto error;
                }
            }
            if (v[f] == NULL) {
                if (f != F_DURATION && f != F_FRAMES) {
                    goto decline; /* a field missing */
                }
                v[f] = Py_None; /* what dict.get gives */
            }
        }
        long long rid, x;
        if (!int64_of(v[F_RID], &rid) || (i > 0 && rid <= prev_rid)) {
            goto decline;
        }
        prev_rid = rid;
        if (!int64_of(v[F_SEQ], &x)) {
            goto decline;
        }
        if (i > 0 && x <= seq[i - 1]) {
            seq_increasing = 0;
        }
        seq[i] = x;
        if (!int64_of(v[F_CREATED], &x)) {
            goto decline;
        }
        created[i] = x;
        if (!int64_of(v[F_OPID], &x)) {
            goto decline;
        }
        op_id[i] = x;
        if (v[F_STATE] != last_state) {
            if (!PyUnicode_CheckExact(v[F_STATE])) {
                goto decline;
            }
            int r = PyDict_Contains(states, v[F_STATE]);
            if (r < 0) {
                goto error;
            }
            if (r == 0) {
                goto decline;
            }
            last_state = v[F_STATE];
        }
        if (v[F_DURATION] != Py_None && !PyFloat_CheckExact(v[F_DURATION])) {
            goto decline;
        }
        if (v[F_FRAMES] != Py_None) {
            if (!PyList_CheckExact(v[F_FRAMES])) {
                goto decline;
            }
            Py_ssize_t len = PyList_GET_SIZE(v[F_FRAMES]);
            if (len > 0) {
                if (len > max_frames - n_frames) {
                    goto decline; /* over the budget: the Python pass refuses it */
                }
                n_frames += len;
                fpos[n_framed++] = i;
            }
        }
        if (v[F_P2P] == Py_True) {
            p2p[i] = 1;
            any_p2p = 1;
        }
        else if (v[F_P2P] == Py_False) {
            p2p[i] = 0;
        }
        else {
            goto decline;
        }
        if (v[F_PG] != last_pg) {
            PyObject *pg = v[F_PG];
            if (!PyTuple_CheckExact(pg) || PyTuple_GET_SIZE(pg) != 2 ||
                !PyUnicode_CheckExact(PyTuple_GET_ITEM(pg, 0)) ||
                !PyUnicode_CheckExact(PyTuple_GET_ITEM(pg, 1))) {
                goto decline;
            }
            PyObject *name = PyTuple_GET_ITEM(pg, 0);
            PyObject *gi = PyDict_GetItemWithError(index, name);
            if (gi == NULL) {
                if (PyErr_Occurred()) {
                    goto error;
                }
                /* A new group: its description is the first entry's that names it. */
                gi = PyLong_FromSsize_t(PyList_GET_SIZE(groups));
                if (gi == NULL) {
                    goto error;
                }
                if (PyDict_SetItem(index, name, gi) < 0 || PyList_Append(groups, name) < 0 ||
                    PyDict_SetItem(descs, name, PyTuple_GET_ITEM(pg, 1)) < 0) {
                    Py_DECREF(gi);
                    goto error;
                }
                Py_DECREF(gi); /* `index` holds it */
            }
            last_gi = PyLong_AsSsize_t(gi);
            last_pg = pg;
        }
        gidx[i] = last_gi;
        if (!PyUnicode_CheckExact(v[F_PROF])) {
            goto decline;
        }
        PyObject *k[5] = {v[F_PROF], v[F_IN], v[F_OUT], v[F_INDT], v[F_OUTDT]};
        slot_t *s = table_find(&table, k);
        if (s->at == NULL) {
            PyObject *key = python_key(k), *pos = PyLong_FromSsize_t(i);
            PyObject *at = (key && pos) ? PyDict_SetDefault(first, key, pos) : NULL;
            Py_XDECREF(key);
            Py_XDECREF(pos);
            if (at == NULL) {
                goto error;
            }
            memcpy(s->k, k, sizeof(s->k));
            s->at = at;
            if (++table.used * 2 > table.mask && table_grow(&table) < 0) {
                goto error;
            }
            Py_INCREF(at);
            PyList_SET_ITEM(key_of, i, at);
        }
        else {
            Py_INCREF(s->at);
            PyList_SET_ITEM(key_of, i, s->at);
        }
    }
    if (n_framed == n) {
        framed = PyObject_CallFunction((PyObject *)&PyRange_Type, "n", n);
    }
    else {
        framed = PyList_New(n_framed);
        for (Py_ssize_t j = 0; framed != NULL && j < n_framed; j++) {
            PyObject *at = PyLong_FromSsize_t(fpos[j]);
            if (at == NULL) {
                goto error;
            }
            PyList_SET_ITEM(framed, j, at);
        }
    }
    if (framed == NULL) {
        goto error;
    }
    if (PyList_GET_SIZE(groups) > 1) {
        group_of = PyList_New(n);
        if (group_of == NULL) {
            goto error;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *gi = PyLong_FromSsize_t(gidx[i]);
            if (gi == NULL) {
                goto error;
            }
            PyList_SET_ITEM(group_of, i, gi);
        }
    }
    else {
        group_of = Py_NewRef(Py_None);
    }
    if (any_p2p) {
        is_p2p = PyList_New(n);
        if (is_p2p == NULL) {
            goto error;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyList_SET_ITEM(is_p2p, i, Py_NewRef(p2p[i] ? Py_True : Py_False));
        }
    }
    else {
        is_p2p = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("(OOOOOOOOOOO)", seq_b, created_b, op_b, seq_increasing ? Py_True : Py_False,
                           groups, descs, group_of, is_p2p, first, key_of, framed);
    goto done;
decline:
    declined = 1;
    goto done;
error:
    /* Only allocation failures get here with the entries that the unpickler makes; anything
     * else the Python pass meets the same way and decides. */
    if (!PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear();
        declined = 1;
    }
done:
    Py_XDECREF(seq_b);
    Py_XDECREF(created_b);
    Py_XDECREF(op_b);
    Py_XDECREF(key_of); /* items not yet set are NULL, which list_dealloc skips */
    Py_XDECREF(first);
    Py_XDECREF(groups);
    Py_XDECREF(descs);
    Py_XDECREF(index);
    Py_XDECREF(framed);
    Py_XDECREF(group_of);
    Py_XDECREF(is_p2p);
    PyMem_Free(gidx);
    PyMem_Free(fpos);
    PyMem_Free(p2p);
    PyMem_Free(table.slots);
    if (declined) {
        Py_RETURN_NONE;
    }
    return result;
}

PyDoc_STRVAR(take_int64_doc,
             "take_int64(keys, values, /)\n--\n\n"
             "values[k] of each k of the list `keys`, packed as 64-bit ints (native order); None\n"
             "where a key is missing or a value is not an exact int within 64 bits.");

static PyObject *
take_int64(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take_int64(list, dict)");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (n > PY_SSIZE_T_MAX / 8) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL) {
        return NULL;
    }
    int64_t *to = (int64_t *)PyBytes_AS_STRING(out);
    PyObject *last = NULL;
    long long x = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        if (k != last) { /* entries of one signature often come in runs */
            PyObject *v = PyLong_CheckExact(k) ? PyDict_GetItemWithError(values, k) : NULL;
            if (v == NULL || !int64_of(v, &x)) {
                Py_DECREF(out);
                if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_MemoryError)) {
                    return NULL;
                }
                PyErr_Clear();
                Py_RETURN_NONE;
            }
            last = k;
        }
        to[i] = x;
    }
    return out;
}

static PyMethodDef rows_methods[] = {
    {"signature_rows", (PyCFunction)(void (*)(void))signature_rows, METH_FASTCALL, signature_rows_doc},
    {"take_int64", (PyCFunction)(void (*)(void))take_int64, METH_FASTCALL, take_int64_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rows_module = {
    PyModuleDef_HEAD_INIT,
    "_rows",
    "The per-entry pass of flightdeck.readers.fr.signatures._signature_rows, in C.",
    -1,
    rows_methods,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    for (int f = 0; f < N_FIELDS; f++) {
        if (field_keys[f] == NULL) {
            field_keys[f] = PyUnicode_InternFromString(field_names[f]);
            if (field_keys[f] == NULL) {
                return NULL;
            }
        }
    }
    peek_on = peek_works();
    PyObject *m = PyModule_Create(&rows_module);
    /* KEY_TABLE_READ: whether `fields_by_peek` is used in this process (tests/test_reader_rows.py). */
    if (m != NULL && PyModule_AddIntConstant(m, "KEY_TABLE_READ", peek_on) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
