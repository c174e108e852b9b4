/* Kafka's v2 records in C: the native twin of rillet.client.wire.recordcodec.
 *
 * recordcodec.py's docstring is the contract (layout, functions, results, errors);
 * tests/test_recordcodec.py runs every test against both. Why native: in Python each
 * record costs a dozen small bytes objects and varint loops, about 1.5 us to build and
 * 2 us to decode; here a record is a few stores (build) or the result objects alone
 * (decode). The GIL stays held: every function touches Python objects throughout.
 *
 * Every read is bounds-checked against the records section's end; a malformed section
 * raises ValueError naming the record, as the twin does. build_batch computes the exact
 * size first, then writes header, records and CRC-32C into one bytes object.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "_crc32c_hw.h"

#define HEADER_SIZE 61
#define CRC_POS 17
#define CRC_START 21
#define LOG_OVERHEAD 12
#define MAGIC 2
#define MIN_RECORD 7 /* length, attributes, two deltas, two null fields, header count */

static PyObject *crc32c_func; /* crc32c.crc32c: the CRC where the CPU offers nothing */
static PyObject *tuple_new;   /* tuple.__new__: decode_records' general path */
static int crc_level;

/* --- small helpers ------------------------------------------------------------------ */

static inline void put_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static inline void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static inline void put_le64(unsigned char *p, uint64_t v) {
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

/* Zigzag without shifting a negative number (implementation-defined in C99). */
static inline uint64_t zigzag64(int64_t v) {
    uint64_t u = (uint64_t)v << 1;
    return v < 0 ? ~u : u;
}

static inline uint64_t zigzag32(int32_t v) {
    uint32_t u = (uint32_t)v << 1;
    return v < 0 ? (uint64_t)(uint32_t)~u : (uint64_t)u;
}

static inline Py_ssize_t uvarint_size(uint64_t u) {
    Py_ssize_t n = 1;
    while (u >= 0x80) {
        u >>= 7;
        n++;
    }
    return n;
}

static inline unsigned char *put_uvarint(unsigned char *p, uint64_t u) {
    while (u >= 0x80) {
        *p++ = (unsigned char)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    *p++ = (unsigned char)u;
    return p;
}

/* An int argument as int64; `*overflow` is -1 or 1 past either end. Non-int: TypeError. */
static int as_int64(PyObject *obj, int64_t *out, int *overflow) {
    long long v = PyLong_AsLongLongAndOverflow(obj, overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (*overflow)
        v = *overflow > 0 ? LLONG_MAX : LLONG_MIN;
    *out = (int64_t)v;
    return 0;
}

static int crc_of(const unsigned char *p, Py_ssize_t n, uint32_t *out) {
    if (crc_level) {
        *out = crc32c_hw(p, (size_t)n);
        return 0;
    }
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *crc = PyObject_CallOneArg(crc32c_func, view);
    Py_DECREF(view);
    if (crc == NULL)
        return -1;
    unsigned long v = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* --- building ----------------------------------------------------------------------- */

/* A nullable byte field's length in bytes (0 for None); -1 with TypeError or ValueError
 * set. The twin's checks, in its order. */
static Py_ssize_t field_length(PyObject *b, Py_ssize_t index, const char *what) {
    Py_ssize_t n;
    if (b == Py_None)
        return 0;
    if (PyBytes_Check(b))
        n = PyBytes_GET_SIZE(b);
    else if (PyByteArray_Check(b))
        n = PyByteArray_GET_SIZE(b);
    else if (PyMemoryView_Check(b)) {
        /* Through the buffer protocol, never the view's own struct: a released view
         * (`with memoryview(x) as mv:` ended) refuses here instead of pointing at
         * freed memory. */
        Py_buffer view;
        if (PyObject_GetBuffer(b, &view, PyBUF_FULL_RO) < 0)
            return -1;
        n = view.len;
        PyBuffer_Release(&view);
    } else {
        PyErr_Format(PyExc_TypeError, "record %zd: %s must be bytes or None, not %.200s",
                     index, what, Py_TYPE(b)->tp_name);
        return -1;
    }
    if (n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "record %zd: %s length %zd does not fit an int32",
                     index, what, n);
        return -1;
    }
    return n;
}

/* A nullable byte field's encoded size (length varint + bytes); -1 with an error set. */
static Py_ssize_t field_size(PyObject *b, Py_ssize_t index, const char *what) {
    if (b == Py_None)
        return 1;
    Py_ssize_t n = field_length(b, index, what);
    if (n < 0)
        return -1;
    return uvarint_size(zigzag32((int32_t)n)) + n;
}

/* Writes a field field_size accepted; -1 with an error set if it no longer fits. */
static int write_field(PyObject *b, unsigned char **pp, unsigned char *end) {
    unsigned char *p = *pp;
    if (b == Py_None) {
        if (p >= end)
            goto changed;
        *p++ = 1; /* zigzag(-1): null */
        *pp = p;
        return 0;
    }
    const char *data;
    Py_ssize_t n;
    if (PyBytes_Check(b)) {
        data = PyBytes_AS_STRING(b);
        n = PyBytes_GET_SIZE(b);
    } else if (PyByteArray_Check(b)) {
        data = PyByteArray_AS_STRING(b);
        n = PyByteArray_GET_SIZE(b);
    } else if (PyMemoryView_Check(b)) {
        Py_buffer view; /* as in field_size: a view released since then refuses */
        if (PyObject_GetBuffer(b, &view, PyBUF_FULL_RO) < 0)
            return -1;
        n = view.len;
        if (n > INT32_MAX || end - p < uvarint_size(zigzag32((int32_t)n)) + n) {
            PyBuffer_Release(&view);
            goto changed;
        }
        p = put_uvarint(p, zigzag32((int32_t)n));
        int rc = PyBuffer_ToContiguous(p, &view, n, 'C');
        PyBuffer_Release(&view);
        if (rc < 0)
            return -1;
        *pp = p + n;
        return 0;
    } else
        goto changed;
    if (n > INT32_MAX || end - p < uvarint_size(zigzag32((int32_t)n)) + n)
        goto changed;
    p = put_uvarint(p, zigzag32((int32_t)n));
    memcpy(p, data, (size_t)n);
    *pp = p + n;
    return 0;
changed:
    PyErr_SetString(PyExc_RuntimeError, "record columns changed while being encoded");
    return -1;
}

/* One header pair as (key str, value): borrowed references; -1 with TypeError set. */
static int header_pair(PyObject *pair, Py_ssize_t index, PyObject **k, PyObject **v) {
    if (PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2) {
        *k = PyTuple_GET_ITEM(pair, 0);
        *v = PyTuple_GET_ITEM(pair, 1);
    } else {
        PyObject *fast = PySequence_Fast(pair, "");
        if (fast == NULL || PySequence_Fast_GET_SIZE(fast) != 2) {
            Py_XDECREF(fast);
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError) &&
                !PyErr_ExceptionMatches(PyExc_ValueError))
                return -1;
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "record %zd: a header must be a (str, bytes) pair",
                         index);
            return -1;
        }
        /* Owned: a list made from another iterable dies with `fast`. */
        *k = Py_NewRef(PySequence_Fast_GET_ITEM(fast, 0));
        *v = Py_NewRef(PySequence_Fast_GET_ITEM(fast, 1));
        Py_DECREF(fast);
        return 1;
    }
    return 0;
}

/* The encoded size of one record's headers (the count varint included), or -1. When
 * `pp` is given, writes them too. */
static Py_ssize_t headers_part(PyObject *hs, Py_ssize_t index, unsigned char **pp,
                               unsigned char *end) {
    int truth = hs == Py_None ? 0 : PyObject_IsTrue(hs);
    if (truth < 0)
        return -1;
    if (!truth) {
        if (pp) {
            if (*pp >= end) {
                PyErr_SetString(PyExc_RuntimeError,
                                "record columns changed while being encoded");
                return -1;
            }
            *(*pp)++ = 0;
        }
        return 1;
    }
    /* The twin takes len(hs) first: an iterator without one is a TypeError there. */
    if (!PyList_Check(hs) && !PyTuple_Check(hs) && PyObject_Size(hs) < 0)
        return -1;
    /* A tuple: the pairs' own code (a custom iterable's) cannot resize what we walk. */
    PyObject *fast = PySequence_Tuple(hs);
    if (fast == NULL)
        return -1;
    Py_ssize_t nh = PyTuple_GET_SIZE(fast);
    if (nh > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "header count %zd does not fit an int32", nh);
        goto fail;
    }
    Py_ssize_t size = uvarint_size(zigzag32((int32_t)nh));
    if (pp) {
        if (end - *pp < size)
            goto changed;
        *pp = put_uvarint(*pp, zigzag32((int32_t)nh));
    }
    for (Py_ssize_t j = 0; j < nh; j++) {
        PyObject *k, *v;
        int owned = header_pair(PyTuple_GET_ITEM(fast, j), index, &k, &v);
        if (owned < 0)
            goto fail;
        Py_ssize_t klen = 0, vsize = 0;
        const char *kutf8 = NULL;
        if (!PyUnicode_Check(k)) {
            PyErr_Format(PyExc_TypeError, "record %zd: a header key must be str, not %.200s",
                         index, Py_TYPE(k)->tp_name);
            goto pair_fail;
        }
        kutf8 = PyUnicode_AsUTF8AndSize(k, &klen); /* cached on the str: cheap twice */
        if (kutf8 == NULL)
            goto pair_fail;
        if (klen > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "header key length %zd does not fit an int32",
                         klen);
            goto pair_fail;
        }
        vsize = field_size(v, index, "a header value");
        if (vsize < 0)
            goto pair_fail;
        Py_ssize_t ksize = uvarint_size(zigzag32((int32_t)klen)) + klen;
        size += ksize + vsize;
        if (pp) {
            if (end - *pp < ksize) {
                if (owned) {
                    Py_DECREF(k);
                    Py_DECREF(v);
                }
                goto changed;
            }
            *pp = put_uvarint(*pp, zigzag32((int32_t)klen));
            memcpy(*pp, kutf8, (size_t)klen);
            *pp += klen;
            if (write_field(v, pp, end) < 0)
                goto pair_fail;
        }
        if (owned) {
            Py_DECREF(k);
            Py_DECREF(v);
        }
        continue;
    pair_fail:
        if (owned) {
            Py_DECREF(k);
            Py_DECREF(v);
        }
        goto fail;
    }
    Py_DECREF(fast);
    return size;
changed:
    PyErr_SetString(PyExc_RuntimeError, "record columns changed while being encoded");
fail:
    Py_DECREF(fast);
    return -1;
}

typedef struct {
    int64_t td;   /* timestamp delta */
    int32_t od;   /* offset delta */
    int32_t body; /* the record's length (after its length varint) */
} rec_plan;

/* A column argument: NULL for None, else a fast sequence of `n` items (new reference). */
static int column(PyObject *obj, Py_ssize_t n, PyObject **out) {
    *out = NULL;
    if (obj == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(obj, "a record column must be a sequence");
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "record columns differ in length");
        return -1;
    }
    *out = fast;
    return 0;
}

/* A header field in range, else ValueError naming it (the twin's order and wording). */
static int check_field(PyObject *obj, int64_t lo, int64_t hi, const char *what,
                       int64_t *out) {
    int overflow;
    if (as_int64(obj, out, &overflow) < 0)
        return -1;
    if (overflow || *out < lo || *out > hi) {
        PyErr_Format(PyExc_ValueError, "%s %S does not fit its field", what, obj);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(build_batch_doc,
"build_batch(values, keys, headers, timestamps, timestamp_ms, offset_deltas, attributes,\n"
"            base_offset, leader_epoch, producer_id, producer_epoch, base_sequence,\n"
"            compress) -> bytes\n"
"--\n\n"
"One whole v2 batch, header and CRC-32C included (recordcodec.py has the contract).");

static PyObject *build_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "build_batch takes 13 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *values = NULL, *keys = NULL, *headers = NULL, *timestamps = NULL,
             *deltas = NULL, *section = NULL, *compressed = NULL, *out = NULL;
    rec_plan *plan = NULL;
    PyObject *ts_slow_delta = NULL; /* a delta computed with Python ints */

    values = PySequence_Fast(args[0], "values must be a sequence");
    if (values == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "a batch needs at least one record");
        goto done;
    }
    if (column(args[1], n, &keys) < 0 || column(args[2], n, &headers) < 0 ||
        column(args[3], n, &timestamps) < 0 || column(args[5], n, &deltas) < 0)
        goto done;
    /* Making a column a sequence may run Python code (an iterable's __iter__) that
     * resizes another column already taken: every length is checked again after. */
    {
        PyObject *all[] = {values, keys, headers, timestamps, deltas};
        for (size_t c = 0; c < sizeof all / sizeof all[0]; c++)
            if (all[c] != NULL && PySequence_Fast_GET_SIZE(all[c]) != n) {
                PyErr_SetString(PyExc_ValueError, "record columns differ in length");
                goto done;
            }
    }
    plan = PyMem_Malloc((size_t)n * sizeof(rec_plan));
    if (plan == NULL) {
        PyErr_NoMemory();
        goto done;
    }

    /* Timestamps: the base is the first record's, the max the largest. A timestamp
     * past int64 ends in ValueError, as in the twin, but not before the per-record
     * checks it would meet first: `ts_slow` computes those deltas with Python ints. */
    int64_t base_ts = 0, max_ts = 0;
    int base_over = 0, max_over = 0, ts_slow = 0;
    if (timestamps == NULL) {
        if (as_int64(args[4], &base_ts, &base_over) < 0)
            goto done;
        max_ts = base_ts;
        max_over = base_over;
    } else {
        PyObject **items = PySequence_Fast_ITEMS(timestamps);
        for (Py_ssize_t i = 0; i < n; i++) {
            int over;
            int64_t t;
            if (!PyLong_Check(items[i])) {
                PyErr_Format(PyExc_TypeError, "record %zd: a timestamp must be int, not %.200s",
                             i, Py_TYPE(items[i])->tp_name);
                goto done;
            }
            if (as_int64(items[i], &t, &over) < 0)
                goto done;
            if (over)
                ts_slow = 1;
            if (i == 0) {
                base_ts = max_ts = t;
                base_over = over;
            } else if (!over && t > max_ts)
                max_ts = t;
            if (over > 0)
                max_over = 1; /* the max is past int64 (below it, so is the base) */
            plan[i].td = t; /* the timestamp for now; its delta below */
        }
    }

    /* Headers (truthiness, len, iteration) and int subclasses (subtraction) can run
     * Python code, which could resize a list being walked: then walk tuple copies. */
    if (headers != NULL || ts_slow) {
        PyObject **cols[] = {&values, &keys, &headers, &timestamps, &deltas};
        for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
            if (*cols[c] != NULL && PyList_Check(*cols[c])) {
                PyObject *t = PyList_AsTuple(*cols[c]);
                if (t == NULL)
                    goto done;
                Py_SETREF(*cols[c], t);
            }
    }

    /* Pass 1: every record's checks, in the twin's order, and its size. */
    Py_ssize_t section_size = 0;
    int64_t prev_delta = -1;
    PyObject **vitems = PySequence_Fast_ITEMS(values);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t od = i;
        if (deltas != NULL) {
            PyObject *d = PySequence_Fast_GET_ITEM(deltas, i);
            int over;
            if (!PyLong_Check(d)) {
                PyErr_Format(PyExc_TypeError, "record %zd: an offset delta must be int, not %.200s",
                             i, Py_TYPE(d)->tp_name);
                goto done;
            }
            if (as_int64(d, &od, &over) < 0)
                goto done;
            if (over < 0 || od <= prev_delta) {
                PyErr_Format(PyExc_ValueError, "record %zd: offset deltas must increase", i);
                goto done;
            }
            prev_delta = od; /* saturated past int64: refused as an int32 below */
        }
        int64_t td = 0;
        if (timestamps != NULL) {
            if (!ts_slow) {
                int64_t t = plan[i].td;
                if ((base_ts > 0 && t < INT64_MIN + base_ts) ||
                    (base_ts < 0 && t > INT64_MAX + base_ts)) {
                    PyErr_Format(PyExc_ValueError,
                                 "record %zd: timestamp delta does not fit an int64", i);
                    goto done;
                }
                td = t - base_ts;
            } else {
                ts_slow_delta = PyNumber_Subtract(PySequence_Fast_GET_ITEM(timestamps, i),
                                                  PySequence_Fast_GET_ITEM(timestamps, 0));
                if (ts_slow_delta == NULL)
                    goto done;
                int over;
                if (as_int64(ts_slow_delta, &td, &over) < 0)
                    goto done;
                Py_CLEAR(ts_slow_delta);
                if (over) {
                    PyErr_Format(PyExc_ValueError,
                                 "record %zd: timestamp delta does not fit an int64", i);
                    goto done;
                }
            }
        }
        if (od < INT32_MIN || od > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "record %zd: offset delta does not fit an int32",
                         i);
            goto done;
        }
        Py_ssize_t body = 1 + uvarint_size(zigzag64(td)) + uvarint_size(zigzag32((int32_t)od));
        Py_ssize_t s = field_size(keys == NULL ? Py_None : PySequence_Fast_GET_ITEM(keys, i),
                                  i, "a key");
        if (s < 0)
            goto done;
        body += s;
        s = field_size(vitems[i], i, "a value");
        if (s < 0)
            goto done;
        body += s;
        if (headers == NULL)
            body += 1;
        else {
            s = headers_part(PySequence_Fast_GET_ITEM(headers, i), i, NULL, NULL);
            if (s < 0)
                goto done;
            body += s;
        }
        if (body > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "record length %zd does not fit an int32", body);
            goto done;
        }
        plan[i].td = td;
        plan[i].od = (int32_t)od;
        plan[i].body = (int32_t)body;
        Py_ssize_t total = uvarint_size(zigzag32((int32_t)body)) + body;
        if (section_size > PY_SSIZE_T_MAX - HEADER_SIZE - total) {
            PyErr_NoMemory();
            goto done;
        }
        section_size += total;
    }

    /* The attributes' codec bits, before the header's range checks as in the twin. */
    int64_t attributes;
    int attr_over;
    long codec_bits;
    if (as_int64(args[6], &attributes, &attr_over) < 0)
        goto done;
    if (attr_over) {
        PyObject *seven = PyLong_FromLong(7);
        PyObject *bits = seven ? PyNumber_And(args[6], seven) : NULL;
        Py_XDECREF(seven);
        if (bits == NULL)
            goto done;
        codec_bits = PyLong_AsLong(bits);
        Py_DECREF(bits);
    } else
        codec_bits = (long)(attributes & 7);
    int compressing = codec_bits != 0;
    PyObject *compress = args[12];
    if (compressing && compress == Py_None) {
        PyErr_SetString(PyExc_ValueError,
                        "attributes name a codec but no compress function was given");
        goto done;
    }

    /* Pass 2: the records, into the final bytes (or, compressing, the section). */
    Py_ssize_t at = compressing ? 0 : HEADER_SIZE;
    PyObject *target = PyBytes_FromStringAndSize(NULL, at + section_size);
    if (target == NULL)
        goto done;
    if (compressing)
        section = target;
    else
        out = target;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(target) + at;
    unsigned char *end = p + section_size;
    for (Py_ssize_t i = 0; i < n; i++) {
        rec_plan *r = &plan[i];
        Py_ssize_t fixed = uvarint_size(zigzag32(r->body)) + 1 + uvarint_size(zigzag64(r->td)) +
                           uvarint_size(zigzag32(r->od));
        if (end - p < fixed) {
            PyErr_SetString(PyExc_RuntimeError, "record columns changed while being encoded");
            goto done;
        }
        unsigned char *record_end = p + uvarint_size(zigzag32(r->body)) + r->body;
        p = put_uvarint(p, zigzag32(r->body));
        *p++ = 0; /* record attributes: unused by Kafka, always 0 */
        p = put_uvarint(p, zigzag64(r->td));
        p = put_uvarint(p, zigzag32(r->od));
        if (write_field(keys == NULL ? Py_None : PySequence_Fast_GET_ITEM(keys, i), &p, end) < 0 ||
            write_field(vitems[i], &p, end) < 0)
            goto done;
        if (headers == NULL) {
            if (p >= end) {
                PyErr_SetString(PyExc_RuntimeError,
                                "record columns changed while being encoded");
                goto done;
            }
            *p++ = 0;
        } else if (headers_part(PySequence_Fast_GET_ITEM(headers, i), i, &p, end) < 0)
            goto done;
        if (p != record_end) {
            PyErr_SetString(PyExc_RuntimeError, "record columns changed while being encoded");
            goto done;
        }
    }
    if (p != end) {
        PyErr_SetString(PyExc_RuntimeError, "record columns changed while being encoded");
        goto done;
    }

    Py_ssize_t body_len = section_size;
    if (compressing) {
        compressed = PyObject_CallOneArg(compress, section);
        if (compressed == NULL)
            goto done;
        if (!PyBytes_CheckExact(compressed))
            Py_SETREF(compressed, PyObject_CallOneArg((PyObject *)&PyBytes_Type, compressed));
        if (compressed == NULL)
            goto done;
        body_len = PyBytes_GET_SIZE(compressed);
    }

    /* The header's fields, checked in the twin's order. */
    int64_t base_offset, leader_epoch, producer_id, producer_epoch, base_sequence;
    if (check_field(args[7], INT64_MIN, INT64_MAX, "base offset", &base_offset) < 0 ||
        check_field(args[8], INT32_MIN, INT32_MAX, "leader epoch", &leader_epoch) < 0 ||
        check_field(args[6], -32768, 32767, "attributes", &attributes) < 0)
        goto done;
    if (base_over || max_over) {
        PyObject *t = timestamps == NULL ? args[4] : PySequence_Fast_GET_ITEM(timestamps, 0);
        if (base_over)
            PyErr_Format(PyExc_ValueError, "base timestamp %S does not fit its field", t);
        else
            PyErr_SetString(PyExc_ValueError, "max timestamp does not fit its field");
        goto done;
    }
    if (check_field(args[9], INT64_MIN, INT64_MAX, "producer id", &producer_id) < 0 ||
        check_field(args[10], -32768, 32767, "producer epoch", &producer_epoch) < 0 ||
        check_field(args[11], INT32_MIN, INT32_MAX, "base sequence", &base_sequence) < 0)
        goto done;
    if (n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "record count %zd does not fit its field", n);
        goto done;
    }
    if (body_len > (Py_ssize_t)INT32_MAX - (HEADER_SIZE - LOG_OVERHEAD)) {
        PyErr_Format(PyExc_ValueError, "batch length %zd does not fit its field",
                     body_len + HEADER_SIZE - LOG_OVERHEAD);
        goto done;
    }
    if (compressing) {
        out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + body_len);
        if (out == NULL)
            goto done;
        memcpy(PyBytes_AS_STRING(out) + HEADER_SIZE, PyBytes_AS_STRING(compressed),
               (size_t)body_len);
    }
    unsigned char *h = (unsigned char *)PyBytes_AS_STRING(out);
    put_u64(h, (uint64_t)base_offset);
    put_u32(h + 8, (uint32_t)(HEADER_SIZE - LOG_OVERHEAD + body_len));
    put_u32(h + 12, (uint32_t)leader_epoch);
    h[16] = MAGIC;
    put_u16(h + 21, (uint16_t)attributes);
    put_u32(h + 23, (uint32_t)plan[n - 1].od);
    put_u64(h + 27, (uint64_t)base_ts);
    put_u64(h + 35, (uint64_t)max_ts);
    put_u64(h + 43, (uint64_t)producer_id);
    put_u16(h + 51, (uint16_t)producer_epoch);
    put_u32(h + 53, (uint32_t)base_sequence);
    put_u32(h + 57, (uint32_t)n);
    uint32_t crc;
    if (crc_of(h + CRC_START, HEADER_SIZE - CRC_START + body_len, &crc) < 0) {
        Py_CLEAR(out);
        goto done;
    }
    put_u32(h + CRC_POS, crc);

done:
    if (PyErr_Occurred())
        Py_CLEAR(out);
    Py_XDECREF(ts_slow_delta);
    Py_XDECREF(values);
    Py_XDECREF(keys);
    Py_XDECREF(headers);
    Py_XDECREF(timestamps);
    Py_XDECREF(deltas);
    Py_XDECREF(section);
    Py_XDECREF(compressed);
    PyMem_Free(plan);
    return out;
}

/* --- decoding ----------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p, *end;
    Py_ssize_t record;
} reader;

typedef struct {
    int32_t od;
    int64_t ts;
    const unsigned char *key, *value; /* NULL: null */
    Py_ssize_t klen, vlen;
    int32_t nh;
    const unsigned char *hdrs, *hend; /* the headers' bytes, when nh > 0 */
} record;

static int fail(reader *r, const char *problem) {
    PyErr_Format(PyExc_ValueError, "record %zd: %s", r->record, problem);
    return -1;
}

static int read_varint32(reader *r, int32_t *out) {
    const unsigned char *p = r->p;
    uint64_t u = 0;
    for (int i = 0; i < 5; i++) {
        if (p + i >= r->end)
            return fail(r, "varint runs past the end of the records");
        unsigned b = p[i];
        u |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            r->p = p + i + 1;
            if (u > 0xFFFFFFFFu)
                return fail(r, "varint does not fit an int32");
            uint32_t w = (uint32_t)u;
            *out = (w & 1) ? (int32_t)~(w >> 1) : (int32_t)(w >> 1);
            return 0;
        }
    }
    return fail(r, "varint longer than 5 bytes");
}

static int read_varint64(reader *r, int64_t *out) {
    const unsigned char *p = r->p;
    uint64_t u = 0;
    for (int i = 0; i < 10; i++) {
        if (p + i >= r->end)
            return fail(r, "varint runs past the end of the records");
        unsigned b = p[i];
        if (i == 9 && b < 0x80 && b > 1)
            return fail(r, "varint does not fit an int64");
        u |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            r->p = p + i + 1;
            *out = (u & 1) ? (int64_t)~(u >> 1) : (int64_t)(u >> 1);
            return 0;
        }
    }
    return fail(r, "varint longer than 10 bytes");
}

static int read_field(reader *r, const char *what, const unsigned char **data,
                      Py_ssize_t *len) {
    int32_t n;
    if (read_varint32(r, &n) < 0)
        return -1;
    if (n == -1) {
        *data = NULL;
        *len = 0;
        return 0;
    }
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "record %zd: %s length %d", r->record, what, (int)n);
        return -1;
    }
    if (n > r->end - r->p) {
        PyErr_Format(PyExc_ValueError, "record %zd: %s of %d bytes runs past the end of the records",
                     r->record, what, (int)n);
        return -1;
    }
    *data = r->p;
    *len = n;
    r->p += n;
    return 0;
}

/* Strict UTF-8 as bytes.decode() accepts it: no overlongs, surrogates or > U+10FFFF. */
static int utf8_valid(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c < 0xC2)
            return 0;
        if (c < 0xE0) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
            continue;
        }
        if (c < 0xF0) {
            if (n - i < 3)
                return 0;
            unsigned c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (c == 0xE0 && c1 < 0xA0) ||
                (c == 0xED && c1 > 0x9F))
                return 0;
            i += 3;
            continue;
        }
        if (c < 0xF5) {
            if (n - i < 4)
                return 0;
            unsigned c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80 || (c == 0xF0 && c1 < 0x90) ||
                (c == 0xF4 && c1 > 0x8F))
                return 0;
            i += 4;
            continue;
        }
        return 0;
    }
    return 1;
}

/* One record, validated (header keys too) without building anything. `base_over`: the
 * base timestamp did not fit int64, so no record's timestamp does (the twin's result
 * save for deltas that bring it back, which no batch header can produce). */
static int read_record(reader *r, int64_t base_ts, int base_over, record *rec) {
    int32_t length;
    if (read_varint32(r, &length) < 0)
        return -1;
    if (length < 0) {
        PyErr_Format(PyExc_ValueError, "record %zd: negative record length %d", r->record,
                     (int)length);
        return -1;
    }
    const unsigned char *start = r->p;
    if (length > r->end - start) {
        PyErr_Format(PyExc_ValueError,
                     "record %zd: record of %d bytes runs past the end of the records",
                     r->record, (int)length);
        return -1;
    }
    if (length < 1)
        return fail(r, "empty record");
    r->p++; /* attributes: unused */
    int64_t td;
    if (read_varint64(r, &td) < 0)
        return -1;
    if (base_over || (base_ts > 0 && td > INT64_MAX - base_ts) ||
        (base_ts < 0 && td < INT64_MIN - base_ts))
        return fail(r, "timestamp does not fit an int64");
    rec->ts = base_ts + td;
    if (read_varint32(r, &rec->od) < 0 || read_field(r, "key", &rec->key, &rec->klen) < 0 ||
        read_field(r, "value", &rec->value, &rec->vlen) < 0 || read_varint32(r, &rec->nh) < 0)
        return -1;
    if (rec->nh < 0) {
        PyErr_Format(PyExc_ValueError, "record %zd: negative header count %d", r->record,
                     (int)rec->nh);
        return -1;
    }
    rec->hdrs = r->p;
    for (int32_t j = 0; j < rec->nh; j++) {
        const unsigned char *hk, *hv;
        Py_ssize_t hklen, hvlen;
        if (read_field(r, "header key", &hk, &hklen) < 0)
            return -1;
        if (hk == NULL)
            return fail(r, "null header key");
        if (!utf8_valid(hk, hklen))
            return fail(r, "header key is not UTF-8");
        if (read_field(r, "header value", &hv, &hvlen) < 0)
            return -1;
        if (r->p - start > length)
            break;
    }
    rec->hend = r->p;
    if (r->p - start != length) {
        PyErr_Format(PyExc_ValueError,
                     "record %zd: record length says %d bytes, its fields take %zd", r->record,
                     (int)length, (Py_ssize_t)(r->p - start));
        return -1;
    }
    return 0;
}

/* The headers of a record read_record accepted: a list of (str, bytes | None). */
static PyObject *build_headers(const record *rec) {
    PyObject *list = PyList_New(rec->nh);
    if (list == NULL)
        return NULL;
    reader r = {rec->hdrs, rec->hend, 0};
    for (int32_t j = 0; j < rec->nh; j++) {
        const unsigned char *hk, *hv;
        Py_ssize_t hklen, hvlen;
        /* read_record accepted these bytes: the reads cannot fail, but stay checked. */
        if (read_field(&r, "header key", &hk, &hklen) < 0 ||
            read_field(&r, "header value", &hv, &hvlen) < 0) {
            Py_DECREF(list);
            return NULL;
        }
        PyObject *name = PyUnicode_DecodeUTF8((const char *)hk, hklen, NULL);
        PyObject *value = name == NULL ? NULL
                          : hv == NULL ? Py_NewRef(Py_None)
                                       : PyBytes_FromStringAndSize((const char *)hv, hvlen);
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, j, pair);
    }
    return list;
}

/* The arguments every decoder shares. */
typedef struct {
    Py_buffer view;
    Py_ssize_t count;
    int64_t base_offset, base_ts;
    int offset_over, ts_over;
    PyObject *append_time; /* borrowed; NULL when None */
    PyObject *last_ts;     /* the previous record's timestamp object, reused when equal */
    int64_t last_ts_value;
} walk_args;

static int walk_begin(walk_args *w, PyObject *section, PyObject *count, PyObject *base_offset,
                      PyObject *base_ts, PyObject *append_time) {
    int over;
    int64_t c;
    if (as_int64(count, &c, &over) < 0)
        return -1;
    if (over < 0 || c < 0) {
        PyErr_Format(PyExc_ValueError, "negative record count %S", count);
        return -1;
    }
    w->count = c > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : (Py_ssize_t)c;
    if (as_int64(base_offset, &w->base_offset, &w->offset_over) < 0 ||
        as_int64(base_ts, &w->base_ts, &w->ts_over) < 0)
        return -1;
    w->append_time = append_time == NULL || append_time == Py_None ? NULL : append_time;
    w->last_ts = NULL;
    if (PyObject_GetBuffer(section, &w->view, PyBUF_SIMPLE) < 0)
        return -1;
    return 0;
}

/* Reads record i into rec, with the offset check the twin makes. */
static inline int walk_record(walk_args *w, reader *r, Py_ssize_t i, record *rec) {
    r->record = i;
    if (read_record(r, w->base_ts, w->ts_over, rec) < 0)
        return -1;
    if (w->offset_over || (w->base_offset > 0 && rec->od > INT64_MAX - w->base_offset) ||
        (w->base_offset < 0 && rec->od < INT64_MIN - w->base_offset))
        return fail(r, "offset does not fit an int64");
    return 0;
}

static int walk_end(walk_args *w, reader *r) {
    if (r->p != r->end) {
        PyErr_Format(PyExc_ValueError, "records section has %zd bytes after its %zd records",
                     (Py_ssize_t)(r->end - r->p), w->count);
        return -1;
    }
    return 0;
}

/* Walks every record without building anything: the error a section gives, if any.
 * Used before allocating for `count` records that cannot all fit in the section. */
static int walk_only(walk_args *w) {
    reader r = {w->view.buf, (const unsigned char *)w->view.buf + w->view.len, 0};
    record rec;
    for (Py_ssize_t i = 0; i < w->count; i++)
        if (walk_record(w, &r, i, &rec) < 0)
            return -1;
    return walk_end(w, &r);
}

/* More records than the section could hold: the walk fails, so say how. */
static int too_many(walk_args *w) {
    if (w->count <= w->view.len / MIN_RECORD)
        return 0;
    if (walk_only(w) == 0)
        PyErr_SetString(PyExc_SystemError, "records section longer than its records allow");
    return -1;
}

static inline PyObject *nullable_bytes(const unsigned char *p, Py_ssize_t n) {
    if (p == NULL)
        return Py_NewRef(Py_None);
    return PyBytes_FromStringAndSize((const char *)p, n);
}

/* A batch's records mostly share one millisecond: one int object serves them all. */
static inline PyObject *timestamp_of(walk_args *w, const record *rec) {
    if (w->append_time != NULL)
        return Py_NewRef(w->append_time);
    if (w->last_ts == NULL || w->last_ts_value != rec->ts) {
        PyObject *t = PyLong_FromLongLong(rec->ts);
        if (t == NULL)
            return NULL;
        Py_XSETREF(w->last_ts, t);
        w->last_ts_value = rec->ts;
    }
    return Py_NewRef(w->last_ts);
}

static void walk_release(walk_args *w) {
    Py_CLEAR(w->last_ts);
    PyBuffer_Release(&w->view);
}

PyDoc_STRVAR(decode_columns_doc,
"decode_columns(section, count, base_offset, base_timestamp, append_time)\n"
"--\n\n"
"(offsets, timestamps, keys, values, headers): five lists of count items.");

static PyObject *decode_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "decode_columns takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    walk_args w;
    if (walk_begin(&w, args[0], args[1], args[2], args[3], args[4]) < 0)
        return NULL;
    PyObject *cols[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *result = NULL;
    if (too_many(&w) < 0)
        goto done;
    for (int c = 0; c < 5; c++)
        if ((cols[c] = PyList_New(w.count)) == NULL)
            goto done;
    reader r = {w.view.buf, (const unsigned char *)w.view.buf + w.view.len, 0};
    record rec;
    for (Py_ssize_t i = 0; i < w.count; i++) {
        if (walk_record(&w, &r, i, &rec) < 0)
            goto done;
        PyObject *o = PyLong_FromLongLong(w.base_offset + rec.od);
        if (o == NULL)
            goto done;
        PyList_SET_ITEM(cols[0], i, o);
        if ((o = timestamp_of(&w, &rec)) == NULL)
            goto done;
        PyList_SET_ITEM(cols[1], i, o);
        if ((o = nullable_bytes(rec.key, rec.klen)) == NULL)
            goto done;
        PyList_SET_ITEM(cols[2], i, o);
        if ((o = nullable_bytes(rec.value, rec.vlen)) == NULL)
            goto done;
        PyList_SET_ITEM(cols[3], i, o);
        if ((o = rec.nh ? build_headers(&rec) : Py_NewRef(Py_None)) == NULL)
            goto done;
        PyList_SET_ITEM(cols[4], i, o);
    }
    if (walk_end(&w, &r) < 0)
        goto done;
    result = PyTuple_Pack(5, cols[0], cols[1], cols[2], cols[3], cols[4]);
done:
    for (int c = 0; c < 5; c++)
        Py_XDECREF(cols[c]);
    walk_release(&w);
    return result;
}

/* A bound given as an int: `over` says it is past either end of int64. */
typedef struct {
    int64_t v;
    int over;
} bound;

static int get_bound(PyObject *obj, bound *b) {
    return as_int64(obj, &b->v, &b->over);
}

static inline int at_least(int64_t x, const bound *lo) {
    return lo->over < 0 || (lo->over == 0 && x >= lo->v);
}

static inline int below(int64_t x, const bound *hi) {
    return hi->over > 0 || (hi->over == 0 && x < hi->v);
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(section, count, base_offset, base_timestamp, append_time, cls, topic,\n"
"               partition, min_offset)\n"
"--\n\n"
"cls(topic, partition, offset, timestamp, key, value, headers) tuples for the records\n"
"at or past min_offset.");

static PyObject *decode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "decode_records takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *cls = args[5], *topic = args[6], *partition = args[7];
    bound min_offset;
    if (get_bound(args[8], &min_offset) < 0)
        return NULL;
    walk_args w;
    if (walk_begin(&w, args[0], args[1], args[2], args[3], args[4]) < 0)
        return NULL;
    PyObject *out = NULL;
    /* A NamedTuple (a tuple subclass adding no instance dict or slots) is allocated and
     * filled directly; anything else goes through tuple.__new__ as in the twin. Python
     * 3.14 caches a tuple's hash in the object: there the general path is the safe one. */
    int direct = 0;
#if PY_VERSION_HEX < 0x030E0000
    direct = PyType_Check(cls) && PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type) &&
             ((PyTypeObject *)cls)->tp_dictoffset == 0 &&
             ((PyTypeObject *)cls)->tp_basicsize == PyTuple_Type.tp_basicsize &&
             ((PyTypeObject *)cls)->tp_itemsize == PyTuple_Type.tp_itemsize;
#endif
    /* The caller's topic and partition go into every record: only objects the collector
     * never tracks (a str and an int) leave a record of atomic fields. */
    int atomic_args = !PyObject_IS_GC(topic) && !PyObject_IS_GC(partition);
    if (too_many(&w) < 0)
        goto fail;
    if ((out = PyList_New(w.count)) == NULL)
        goto fail;
    Py_ssize_t kept = 0;
    reader r = {w.view.buf, (const unsigned char *)w.view.buf + w.view.len, 0};
    record rec;
    for (Py_ssize_t i = 0; i < w.count; i++) {
        if (walk_record(&w, &r, i, &rec) < 0)
            goto fail;
        int64_t offset = w.base_offset + rec.od;
        if (!at_least(offset, &min_offset))
            continue;
        PyObject *items[7];
        items[0] = Py_NewRef(topic);
        items[1] = Py_NewRef(partition);
        items[2] = PyLong_FromLongLong(offset);
        items[3] = timestamp_of(&w, &rec);
        items[4] = nullable_bytes(rec.key, rec.klen);
        items[5] = nullable_bytes(rec.value, rec.vlen);
        items[6] = rec.nh ? build_headers(&rec) : Py_NewRef(Py_None);
        PyObject *t = NULL;
        if (items[2] && items[3] && items[4] && items[5] && items[6]) {
            if (direct) {
                t = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 7);
                if (t != NULL) {
                    for (int k = 0; k < 7; k++)
                        PyTuple_SET_ITEM(t, k, items[k]);
                    /* Without headers every item is atomic (str, int, bytes, None): the
                     * record can be in no cycle. The collector untracks only exact tuples
                     * by itself; a tracked record a consumer still holds would be walked
                     * by every full collection, and push the next one closer. (Its
                     * reference to its class goes unseen too: a class that kept one of
                     * its own records would never be collected. The record types are
                     * module-level classes, alive for the process anyway.) */
                    if (!rec.nh && atomic_args)
                        PyObject_GC_UnTrack(t);
                    PyList_SET_ITEM(out, kept++, t);
                    continue;
                }
            } else {
                PyObject *tup = PyTuple_New(7);
                if (tup != NULL) {
                    for (int k = 0; k < 7; k++)
                        PyTuple_SET_ITEM(tup, k, items[k]);
                    t = PyObject_CallFunctionObjArgs(tuple_new, cls, tup, NULL);
                    Py_DECREF(tup);
                    if (t == NULL)
                        goto fail;
                    PyList_SET_ITEM(out, kept++, t);
                    continue;
                }
            }
        }
        for (int k = 0; k < 7; k++)
            Py_XDECREF(items[k]);
        goto fail;
    }
    if (walk_end(&w, &r) < 0)
        goto fail;
    Py_SET_SIZE(out, kept); /* the slots past `kept` are NULL and stay allocated */
    walk_release(&w);
    return out;
fail:
    Py_XDECREF(out);
    walk_release(&w);
    return NULL;
}

PyDoc_STRVAR(decode_arrow_doc,
"decode_arrow(section, count, base_offset, base_timestamp, append_time, lo, hi)\n"
"--\n\n"
"The records with lo <= offset < hi as Arrow-ready buffers: (n, offsets, timestamps,\n"
"key_validity, key_offsets, key_data, value_validity, value_offsets, value_data,\n"
"headers).");

static PyObject *decode_arrow(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "decode_arrow takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    bound lo, hi;
    if (get_bound(args[5], &lo) < 0 || get_bound(args[6], &hi) < 0)
        return NULL;
    walk_args w;
    if (walk_begin(&w, args[0], args[1], args[2], args[3], args[4]) < 0)
        return NULL;
    PyObject *offsets = NULL, *timestamps = NULL, *kv = NULL, *ko = NULL, *kd = NULL,
             *vv = NULL, *vo = NULL, *vd = NULL, *headers = NULL, *result = NULL;
    /* Pass 1: validate every record (the twin decodes them all) and size the kept. */
    reader r = {w.view.buf, (const unsigned char *)w.view.buf + w.view.len, 0};
    record rec;
    Py_ssize_t n = 0, key_bytes = 0, value_bytes = 0;
    int any_headers = 0;
    for (Py_ssize_t i = 0; i < w.count; i++) {
        if (walk_record(&w, &r, i, &rec) < 0)
            goto done;
        int64_t offset = w.base_offset + rec.od;
        if (at_least(offset, &lo) && below(offset, &hi)) {
            n++;
            key_bytes += rec.klen;
            value_bytes += rec.vlen;
            any_headers |= rec.nh != 0;
        }
    }
    if (walk_end(&w, &r) < 0)
        goto done;
    if (key_bytes > INT32_MAX || value_bytes > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "decoded column exceeds 2 GiB");
        goto done;
    }
    int64_t append = 0;
    if (w.append_time != NULL && n > 0) {
        long long a = PyLong_AsLongLong(w.append_time);
        if (a == -1 && PyErr_Occurred())
            goto done;
        append = a;
    }
    Py_ssize_t bitmap = (n + 7) / 8;
    if ((offsets = PyBytes_FromStringAndSize(NULL, 8 * n)) == NULL ||
        (timestamps = PyBytes_FromStringAndSize(NULL, 8 * n)) == NULL ||
        (kv = PyBytes_FromStringAndSize(NULL, bitmap)) == NULL ||
        (ko = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))) == NULL ||
        (kd = PyBytes_FromStringAndSize(NULL, key_bytes)) == NULL ||
        (vv = PyBytes_FromStringAndSize(NULL, bitmap)) == NULL ||
        (vo = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))) == NULL ||
        (vd = PyBytes_FromStringAndSize(NULL, value_bytes)) == NULL)
        goto done;
    if (any_headers && (headers = PyList_New(n)) == NULL)
        goto done;
    unsigned char *po = (unsigned char *)PyBytes_AS_STRING(offsets),
                  *pt = (unsigned char *)PyBytes_AS_STRING(timestamps),
                  *pkv = (unsigned char *)PyBytes_AS_STRING(kv),
                  *pko = (unsigned char *)PyBytes_AS_STRING(ko),
                  *pkd = (unsigned char *)PyBytes_AS_STRING(kd),
                  *pvv = (unsigned char *)PyBytes_AS_STRING(vv),
                  *pvo = (unsigned char *)PyBytes_AS_STRING(vo),
                  *pvd = (unsigned char *)PyBytes_AS_STRING(vd);
    memset(pkv, 0, (size_t)bitmap);
    memset(pvv, 0, (size_t)bitmap);
    put_le32(pko, 0);
    put_le32(pvo, 0);
    /* Pass 2: the same records, now known good, into the buffers. */
    r.p = w.view.buf;
    Py_ssize_t j = 0, kpos = 0, vpos = 0;
    for (Py_ssize_t i = 0; i < w.count && j < n; i++) {
        if (walk_record(&w, &r, i, &rec) < 0)
            goto done;
        int64_t offset = w.base_offset + rec.od;
        if (!(at_least(offset, &lo) && below(offset, &hi)))
            continue;
        put_le64(po + 8 * j, (uint64_t)offset);
        put_le64(pt + 8 * j, (uint64_t)(w.append_time != NULL ? append : rec.ts));
        if (rec.key != NULL) {
            pkv[j >> 3] |= (unsigned char)(1u << (j & 7));
            memcpy(pkd + kpos, rec.key, (size_t)rec.klen);
            kpos += rec.klen;
        }
        put_le32(pko + 4 * (j + 1), (uint32_t)kpos);
        if (rec.value != NULL) {
            pvv[j >> 3] |= (unsigned char)(1u << (j & 7));
            memcpy(pvd + vpos, rec.value, (size_t)rec.vlen);
            vpos += rec.vlen;
        }
        put_le32(pvo + 4 * (j + 1), (uint32_t)vpos);
        if (headers != NULL) {
            PyObject *h = rec.nh ? build_headers(&rec) : Py_NewRef(Py_None);
            if (h == NULL)
                goto done;
            PyList_SET_ITEM(headers, j, h);
        }
        j++;
    }
    PyObject *nobj = PyLong_FromSsize_t(n);
    if (nobj == NULL)
        goto done;
    result = PyTuple_Pack(10, nobj, offsets, timestamps, kv, ko, kd, vv, vo, vd,
                          headers != NULL ? headers : Py_None);
    Py_DECREF(nobj);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    Py_XDECREF(kv);
    Py_XDECREF(ko);
    Py_XDECREF(kd);
    Py_XDECREF(vv);
    Py_XDECREF(vo);
    Py_XDECREF(vd);
    Py_XDECREF(headers);
    walk_release(&w);
    return result;
}

PyDoc_STRVAR(check_records_doc,
"check_records(section, count, base_timestamp, contiguous)\n"
"--\n\n"
"(max_timestamp, last_offset_delta, first_null_key) of a section, walked without\n"
"building any record; ValueError unless it holds exactly count well-formed records\n"
"with offset deltas increasing from 0 or more (contiguous: exactly 0..count-1).");

static PyObject *check_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "check_records takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    int contiguous = PyObject_IsTrue(args[3]);
    if (contiguous < 0)
        return NULL;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        return NULL;
    walk_args w;
    int began = walk_begin(&w, args[0], args[1], zero, args[2], Py_None);
    Py_DECREF(zero);
    if (began < 0)
        return NULL;
    reader r = {w.view.buf, (const unsigned char *)w.view.buf + w.view.len, 0};
    record rec;
    int64_t max_ts = 0, prev = -1;
    Py_ssize_t first_null_key = -1;
    for (Py_ssize_t i = 0; i < w.count; i++) {
        if (walk_record(&w, &r, i, &rec) < 0)
            goto fail;
        if (contiguous ? rec.od != i : rec.od <= prev) {
            if (contiguous)
                PyErr_Format(PyExc_ValueError, "record %zd: offset delta %d, expected %zd", i,
                             (int)rec.od, i);
            else
                PyErr_Format(PyExc_ValueError,
                             "record %zd: offset delta %d, expected more than %lld", i,
                             (int)rec.od, (long long)prev);
            goto fail;
        }
        prev = rec.od;
        if (i == 0 || rec.ts > max_ts)
            max_ts = rec.ts;
        if (rec.key == NULL && first_null_key < 0)
            first_null_key = i;
    }
    if (walk_end(&w, &r) < 0)
        goto fail;
    walk_release(&w);
    if (w.count == 0) {
        PyErr_SetString(PyExc_ValueError, "a batch needs at least one record");
        return NULL;
    }
    return Py_BuildValue("(LLn)", (long long)max_ts, (long long)prev, first_null_key);
fail:
    walk_release(&w);
    return NULL;
}

/* --- rillet's load-test values (client/spark/jobs.py: make_value, make_values) --------
 *
 * Not part of Kafka's format: the values `rillet spark load` sends, built here because
 * building them was most of a load's CPU (Spark SQL in the JVM spent about 1.4 CPU
 * seconds per million records, a Python loop 0.8; here it is a few stores and a CRC).
 * The layout is jobs.py's docstring: "RLT1" | task u32 | seq u64 | crc u32 | payload,
 * the payload the 25 ASCII bytes "%08X%016X;" % (task, seq) repeated and cut, and the
 * CRC zlib's CRC-32 over bytes 4..16 then the payload. CRC-32 by slicing-by-8: eight
 * tables built at import, eight bytes per step. */

static uint32_t crc32_tables[8][256];

static void crc32_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc32_tables[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = crc32_tables[t - 1][i];
            crc32_tables[t][i] = (c >> 8) ^ crc32_tables[0][c & 0xFF];
        }
}

/* zlib's crc32(data, crc): the running value goes in and comes out un-inverted. */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        crc = crc32_tables[7][lo & 0xFF] ^ crc32_tables[6][(lo >> 8) & 0xFF] ^
              crc32_tables[5][(lo >> 16) & 0xFF] ^ crc32_tables[4][lo >> 24] ^
              crc32_tables[3][hi & 0xFF] ^ crc32_tables[2][(hi >> 8) & 0xFF] ^
              crc32_tables[1][(hi >> 16) & 0xFF] ^ crc32_tables[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc32_tables[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#define LOAD_HEADER 20
#define LOAD_PATTERN 25

static void put_hex(unsigned char *p, uint64_t v, int digits) {
    static const char hex[] = "0123456789ABCDEF";
    for (int i = digits - 1; i >= 0; i--, v >>= 4)
        p[i] = (unsigned char)hex[v & 0xF];
}

PyDoc_STRVAR(make_values_doc,
"make_values(task, first_seq, count, size, /)\n"
"--\n\n"
"[make_value(task, seq, size) for seq in first_seq .. first_seq + count - 1], as bytes.");

static PyObject *make_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "make_values takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    unsigned long long task = PyLong_AsUnsignedLongLong(args[0]);
    if (task == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long first = PyLong_AsUnsignedLongLong(args[1]);
    if (first == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[3]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (task > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "task does not fit 32 bits");
        return NULL;
    }
    if (count < 0 || size < LOAD_HEADER) {
        PyErr_Format(PyExc_ValueError, "need count >= 0 and size >= %d", LOAD_HEADER);
        return NULL;
    }
    if (count > 0 && first + (unsigned long long)(count - 1) < first) {
        PyErr_SetString(PyExc_OverflowError, "seq does not fit 64 bits");
        return NULL;
    }
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    unsigned char pattern[LOAD_PATTERN];
    put_hex(pattern, task, 8);
    pattern[LOAD_PATTERN - 1] = ';';
    Py_ssize_t pad = size - LOAD_HEADER;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t seq = first + (uint64_t)i;
        PyObject *v = PyBytes_FromStringAndSize(NULL, size);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(v);
        memcpy(p, "RLT1", 4);
        put_u32(p + 4, (uint32_t)task);
        put_u64(p + 8, seq);
        put_hex(pattern + 8, seq, 16);
        unsigned char *q = p + LOAD_HEADER;
        Py_ssize_t left = pad;
        while (left > 0) {
            Py_ssize_t n = left < LOAD_PATTERN ? left : LOAD_PATTERN;
            memcpy(q, pattern, (size_t)n);
            q += n;
            left -= n;
        }
        uint32_t crc = crc32_update(crc32_update(0, p + 4, 12), p + LOAD_HEADER, (size_t)pad);
        put_u32(p + 16, crc);
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* --- the producer's send_many (client/accumulator.py) ----------------------------- */

PyDoc_STRVAR(column_cut_doc,
"column_cut(values, keys, start, room, overhead, /)\n--\n\n"
"Where a slice of send_many's records ends: the fewest records from values[start] on\n"
"whose sizes (len(value) + len(key) + overhead, None counting 0) add up to room or\n"
"more, else all of them; returns (end, nbytes). keys is None or as long as values.\n"
"Each value and key must be bytes, bytearray, memoryview or None: TypeError naming\n"
"the record, as build_batch raises.");

static PyObject *column_cut(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "column_cut takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    long long room = PyLong_AsLongLong(args[3]);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t overhead = PyLong_AsSsize_t(args[4]);
    if (overhead == -1 && PyErr_Occurred())
        return NULL;
    if (overhead < 0 || overhead > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "overhead must be within 0..2**31-1");
        return NULL;
    }
    PyObject *values = PySequence_Fast(args[0], "values must be a sequence");
    if (values == NULL)
        return NULL;
    PyObject *keys = NULL;
    if (args[1] != Py_None) {
        keys = PySequence_Fast(args[1], "keys must be a sequence or None");
        if (keys == NULL) {
            Py_DECREF(values);
            return NULL;
        }
    }
    PyObject *result = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values);
    if (keys != NULL && PySequence_Fast_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "values and keys differ in length");
        goto done;
    }
    if (start < 0 || start > n) {
        PyErr_Format(PyExc_ValueError, "start %zd is outside 0..%zd", start, n);
        goto done;
    }
    PyObject **v = PySequence_Fast_ITEMS(values);
    PyObject **k = keys != NULL ? PySequence_Fast_ITEMS(keys) : NULL;
    long long total = 0;
    Py_ssize_t i = start;
    while (i < n) {
        Py_ssize_t size = field_length(v[i], i, "a value");
        if (size < 0)
            goto done;
        long long add = (long long)size + overhead; /* each under 2**31: no overflow */
        if (k != NULL) {
            size = field_length(k[i], i, "a key");
            if (size < 0)
                goto done;
            add += size;
        }
        if (total > LLONG_MAX - add) {
            PyErr_SetString(PyExc_OverflowError, "the records' sizes do not fit 64 bits");
            goto done;
        }
        total += add;
        i++;
        if (total >= room)
            break;
    }
    result = Py_BuildValue("(nL)", i, total);
done:
    Py_DECREF(values);
    Py_XDECREF(keys);
    return result;
}

/* --- the module --------------------------------------------------------------------- */

PyDoc_STRVAR(crc32c_doc, "crc32c(data, /)\n--\n\n"
"CRC-32C of data as build_batch computes it; for tests against the crc32c package.");

static PyObject *crc32c_of(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc;
    int rc = crc_of(view.buf, view.len, &crc);
    PyBuffer_Release(&view);
    return rc < 0 ? NULL : PyLong_FromUnsignedLong(crc);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef methods[] = {
    {"build_batch", FASTCALL(build_batch), build_batch_doc},
    {"decode_columns", FASTCALL(decode_columns), decode_columns_doc},
    {"decode_records", FASTCALL(decode_records), decode_records_doc},
    {"decode_arrow", FASTCALL(decode_arrow), decode_arrow_doc},
    {"check_records", FASTCALL(check_records), check_records_doc},
    {"crc32c", crc32c_of, METH_O, crc32c_doc},
    {"make_values", FASTCALL(make_values), make_values_doc},
    {"column_cut", FASTCALL(column_cut), column_cut_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_recordcodec",
    "Native twin of rillet.client.wire.recordcodec: Kafka's v2 records.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recordcodec(void) {
    crc_level = crc32c_hw_init();
    crc32_init();
    PyObject *crc32c = PyImport_ImportModule("crc32c");
    if (crc32c == NULL)
        return NULL;
    Py_XSETREF(crc32c_func, PyObject_GetAttrString(crc32c, "crc32c"));
    Py_DECREF(crc32c);
    if (crc32c_func == NULL)
        return NULL;
    Py_XSETREF(tuple_new, PyObject_GetAttrString((PyObject *)&PyTuple_Type, "__new__"));
    if (tuple_new == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL || PyModule_AddIntConstant(module, "CRC_LEVEL", crc_level) < 0) {
        Py_XDECREF(module);
        return NULL;
    }
    return module;
}
