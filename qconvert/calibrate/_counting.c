/* The observers' per-element loops, in C. numpy takes six passes over the values for the first (zero
 * count, scale, floor, offset, cast, bincount) and three for the second (shift, cast, bincount): 2.4-2.6
 * and 1.8-1.9 ns per element on our 2-core test machine (98 K-element tensors in cache); one loop here
 * does each in 0.7-0.8 (float32 arithmetic where it is exact, else 1.1-1.2 in float64) and 0.5-0.6 ns,
 * without the GIL. The extrema take one pass (0.2 ns in cache) where numpy's min() and max() take two.
 * qconvert.calibrate.counting holds the numpy versions, which define the results;
 * tests/calibrate/test_counting.py checks that both agree bin for bin.
 *
 * aligned_bin_counts(values, exponent, first_bin, counts) -> zeros
 *     counts[floor(x * 2**-exponent) - first_bin] += 1 for each float32 x of `values` (every one of them
 *     must land in counts: finite, inside the bins, else ValueError and `counts` unchanged); returns how
 *     many x are exactly zero (+0.0 or -0.0).
 * aligned_bin_counts_and_extrema(values, exponent, first_bin, counts) -> (zeros, minimum, maximum) or None
 *     aligned_bin_counts and finite_extrema in one pass over a non-empty `values`; None, with `counts`
 *     unchanged, when a value is not finite or lies outside the bins (the caller then takes two passes).
 * exponent_field_counts(values, counts)
 *     counts[bits(x) >> 23] += 1 for each float32 x: 512 fields, sign * 256 + the biased exponent.
 * finite_extrema(values) -> (minimum, maximum) or None
 *     The least and greatest float32 x of a non-empty `values` when all are finite (a zero extreme as +0.0),
 *     else None; one pass where numpy's min() and max() take two.
 *
 * `values` is a C-contiguous float32 buffer, `counts` a C-contiguous, writable int64 buffer that no other
 * thread touches during the call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* gcc builds a baseline, an AVX2 and an AVX-512 version of each loop and picks one at load time: the
 * baseline x86-64 has no vector float64 -> int conversion with the range this needs. The x86-64-v3/v4
 * names exist from gcc 11; the choice at load time needs glibc's ifunc. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
#define VECTOR_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define VECTOR_CLONES
#endif

enum {
    CHUNK = 2048,            /* indices computed per step: 8 KiB, in L1 beside the sub-histograms */
    LANES = 4,               /* sub-histograms: consecutive equal bins do not wait on each other's store */
    MAX_LANED_BINS = 1 << 14, /* up to 256 KiB of sub-histograms; wider histograms get one */
    EXPONENT_FIELDS = 512,    /* float32 bits >> 23: sign * 256 + biased exponent */
    EXTREMA_LANES = 16        /* independent minima and maxima: one or two vector registers each */
};

/* A float32's bits as an int32 that orders as the float does (-0.0 just below +0.0, NaN aside): negative
 * floats get their magnitude bits flipped, which `from_order_key` undoes. Integer minima and maxima
 * vectorise without the float reductions' ordering rules, so the bin loops below track them nearly for
 * free. */
static inline int32_t order_key(const float *value) {
    int32_t bits;
    memcpy(&bits, value, sizeof bits);
    return bits ^ (bits < 0 ? INT32_MAX : 0);
}

static inline float from_order_key(int32_t key) {
    const int32_t bits = key ^ (key < 0 ? INT32_MAX : 0);
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Bin indices of one chunk; returns how many of its values are zero, and 0 in *outside when every index
 * is in [0, size). `y - first` is exact but when y and first are both negative and |y| < |first| / 2
 * (Sterbenz); there it may round up to the next integer, its floor is then one too many, and the exact
 * comparison `t + first > y` catches that. Values outside the bins (and NaN, ±Inf) come out below 0 or
 * as `size`; the clamps keep the conversion in range. keys[0] and keys[1] take the least and greatest
 * `order_key` of the values. */
VECTOR_CLONES
static int64_t bin_indices(const float *x, Py_ssize_t n, double scale, double first, int32_t size,
                           int32_t *indices, int *outside, int32_t keys[2]) {
    int64_t zeros = 0;
    int32_t low = 0, high = 0, least_key = keys[0], greatest_key = keys[1];
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Exact: float32 times a power of two, in float64's range (so a compiler fusing the product into
         * the subtraction below as a multiply-add changes nothing). */
        double y = (double)x[i] * scale;
        double offset = y - first;
        offset = offset >= -1.0 ? offset : -1.0; /* also NaN */
        offset = offset <= (double)size ? offset : (double)size;
        int32_t t = (int32_t)offset; /* truncation: the floor for offset >= 0 */
        t -= (double)t + first > y;
        indices[i] = t;
        low = t < low ? t : low;
        high = t > high ? t : high;
        zeros += x[i] == 0.0f;
        const int32_t key = order_key(x + i);
        least_key = key < least_key ? key : least_key;
        greatest_key = key > greatest_key ? key : greatest_key;
    }
    keys[0] = least_key;
    keys[1] = greatest_key;
    *outside = low < 0 || high >= size;
    return zeros;
}

/* `bin_indices` in float32, twice the lanes: exact when -126 <= exponent <= 0 and every bin index
 * below 2**24 in magnitude (the caller checks both). x * 2**-exponent then neither underflows nor rounds,
 * its floor is an integer below 2**24 + size, and so is its difference to `first` inside the bins; a value
 * outside them (or NaN, ±Inf) still lands below 0 or at `size`, since rounding is monotonic. */
VECTOR_CLONES
static int64_t bin_indices_float32(const float *x, Py_ssize_t n, float scale, float first, int32_t size,
                                   int32_t *indices, int *outside, int32_t keys[2]) {
    int32_t zeros = 0; /* n <= CHUNK */
    int32_t low = 0, high = 0, least_key = keys[0], greatest_key = keys[1];
    for (Py_ssize_t i = 0; i < n; i++) {
        float offset = floorf(x[i] * scale) - first;
        offset = offset >= -1.0f ? offset : -1.0f; /* also NaN */
        offset = offset <= (float)size ? offset : (float)size;
        int32_t t = (int32_t)offset;
        indices[i] = t;
        low = t < low ? t : low;
        high = t > high ? t : high;
        zeros += x[i] == 0.0f;
        const int32_t key = order_key(x + i);
        least_key = key < least_key ? key : least_key;
        greatest_key = key > greatest_key ? key : greatest_key;
    }
    keys[0] = least_key;
    keys[1] = greatest_key;
    *outside = low < 0 || high >= size;
    return zeros;
}

/* Adds the int32 sub-histograms into the int64 totals. */
static void add_lanes(const int32_t *lanes, Py_ssize_t lane_count, Py_ssize_t size, int64_t *totals) {
    for (Py_ssize_t lane = 0; lane < lane_count; lane++) {
        for (Py_ssize_t k = 0; k < size; k++) {
            totals[k] += lanes[lane * size + k];
        }
    }
}

/* 0; -1 when a value lies outside the bins, -2 when memory runs out; `counts` change only on success.
 * With `extrema` (else NULL), also the least and greatest value (a zero extreme as +0.0), set on success
 * only: every value was inside the bins, hence finite, so the extreme order keys are the extreme values. */
static int count_bins(const float *x, Py_ssize_t n, int exponent, int64_t first_bin, int64_t *counts,
                      Py_ssize_t size, int64_t *zeros, float extrema[2]) {
    const Py_ssize_t lane_count = size <= MAX_LANED_BINS ? LANES : 1;
    /* int32 sub-histograms: half the cache of int64 ones (4 x 4097 bins: 64 KiB), 10-12% faster per element
     * on a BERT's tensors. A lane takes at most CHUNK counts per chunk; they are added into int64 totals
     * every 2**20 values (about 1% of the time: 16 K additions per million values binned), far below
     * 2**31, and on every tensor of more than a million values, which the tests have. */
    const Py_ssize_t flush_every = ((Py_ssize_t)1 << 20) / CHUNK;
    int32_t *lanes = calloc((size_t)lane_count * (size_t)size, sizeof(int32_t));
    int64_t *totals = calloc((size_t)size, sizeof(int64_t));
    if (lanes == NULL || totals == NULL) {
        free(lanes);
        free(totals);
        return -2;
    }
    int32_t indices[CHUNK];
    int32_t keys[2] = {INT32_MAX, INT32_MIN};
    const double scale = ldexp(1.0, -exponent);
    const int64_t float32_exact = 1 << 24;
    const int narrow = -126 <= exponent && exponent <= 0 && first_bin > -float32_exact &&
                       first_bin + size < float32_exact && size <= float32_exact;
    int status = 0;
    *zeros = 0;
    Py_ssize_t chunks = 0;
    for (Py_ssize_t start = 0; start < n; start += CHUNK) {
        const Py_ssize_t m = n - start < CHUNK ? n - start : CHUNK;
        int outside;
        if (narrow) {
            *zeros += bin_indices_float32(x + start, m, (float)scale, (float)first_bin, (int32_t)size,
                                          indices, &outside, keys);
        } else {
            *zeros += bin_indices(x + start, m, scale, (double)first_bin, (int32_t)size, indices, &outside,
                                  keys);
        }
        if (outside) {
            status = -1;
            break;
        }
        Py_ssize_t i = 0;
        if (lane_count == LANES) {
            for (; i + LANES <= m; i += LANES) {
                lanes[indices[i]]++;
                lanes[size + indices[i + 1]]++;
                lanes[2 * size + indices[i + 2]]++;
                lanes[3 * size + indices[i + 3]]++;
            }
        }
        for (; i < m; i++) {
            lanes[indices[i]]++;
        }
        if (++chunks == flush_every) {
            add_lanes(lanes, lane_count, size, totals);
            memset(lanes, 0, (size_t)lane_count * (size_t)size * sizeof(int32_t));
            chunks = 0;
        }
    }
    if (status == 0 && extrema != NULL && n > 0) {
        for (int j = 0; j < 2; j++) {
            extrema[j] = from_order_key(keys[j]) + 0.0f; /* -0.0 -> +0.0 */
        }
    }
    if (status == 0) {
        add_lanes(lanes, lane_count, size, totals);
        for (Py_ssize_t k = 0; k < size; k++) {
            counts[k] += totals[k];
        }
    }
    free(lanes);
    free(totals);
    return status;
}

static void count_fields(const uint32_t *bits, Py_ssize_t n, int64_t *counts) {
    int64_t lanes[LANES][EXPONENT_FIELDS];
    memset(lanes, 0, sizeof lanes);
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        lanes[0][bits[i] >> 23]++;
        lanes[1][bits[i + 1] >> 23]++;
        lanes[2][bits[i + 2] >> 23]++;
        lanes[3][bits[i + 3] >> 23]++;
    }
    for (; i < n; i++) {
        lanes[0][bits[i] >> 23]++;
    }
    for (int k = 0; k < EXPONENT_FIELDS; k++) {
        counts[k] += lanes[0][k] + lanes[1][k] + lanes[2][k] + lanes[3][k];
    }
}

/* 1 when some x is NaN or ±Inf (an all-ones exponent field); else 0 and the extremes. `v < low ? v : low`
 * is one vector min instruction (it keeps `low` when v is NaN), and the lanes make it a plain loop, not a
 * floating-point reduction the compiler may not reorder. */
VECTOR_CLONES
static int extrema_loop(const float *x, Py_ssize_t n, float *minimum, float *maximum) {
    float low[EXTREMA_LANES], high[EXTREMA_LANES];
    uint32_t special[EXTREMA_LANES];
    for (int j = 0; j < EXTREMA_LANES; j++) {
        low[j] = high[j] = x[0];
        special[j] = 0;
    }
    Py_ssize_t i = 0;
    for (; i + EXTREMA_LANES <= n; i += EXTREMA_LANES) {
        for (int j = 0; j < EXTREMA_LANES; j++) {
            const float v = x[i + j];
            uint32_t bits;
            memcpy(&bits, x + i + j, sizeof bits); /* gcc 12 vectorises this, not `&x[i + j]` (-fwrapv) */
            low[j] = v < low[j] ? v : low[j];
            high[j] = v > high[j] ? v : high[j];
            special[j] |= (bits & 0x7f800000u) == 0x7f800000u;
        }
    }
    for (; i < n; i++) {
        const float v = x[i];
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        low[0] = v < low[0] ? v : low[0];
        high[0] = v > high[0] ? v : high[0];
        special[0] |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    uint32_t any_special = 0;
    float least = low[0], greatest = high[0];
    for (int j = 0; j < EXTREMA_LANES; j++) {
        any_special |= special[j];
        least = low[j] < least ? low[j] : least;
        greatest = high[j] > greatest ? high[j] : greatest;
    }
    *minimum = least + 0.0f; /* -0.0 -> +0.0: which zero a lane kept depends on the order */
    *maximum = greatest + 0.0f;
    return any_special != 0;
}

/* Buffers: C-contiguous, of the given item kind ('f': float32, 'q': int64) */

/* The one struct character of a native, single-item format ('f', 'q', ...), or 0. */
static char item_code(const char *format) {
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') {
        format++;
    }
    return format[1] == '\0' ? format[0] : 0;
}

static int get_buffer(PyObject *object, Py_buffer *view, char kind, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (kind == 'q' ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object, view, flags) != 0) {
        return -1;
    }
    const char code = item_code(view->format);
    /* numpy writes int64 as 'l' on LP64 platforms and 'q' elsewhere */
    int ok = kind == 'q' ? view->itemsize == 8 && (code == 'q' || code == 'l')
                         : view->itemsize == 4 && code == 'f';
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must hold %s, got format '%s'", name,
                     kind == 'q' ? "int64" : "float32", view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Both buffers of a call, or none (and the error set). */
static int get_values_and_counts(PyObject *values_object, PyObject *counts_object, Py_buffer *values,
                                 Py_buffer *counts) {
    if (get_buffer(values_object, values, 'f', "values") != 0) {
        return -1;
    }
    if (get_buffer(counts_object, counts, 'q', "counts") != 0) {
        PyBuffer_Release(values);
        return -1;
    }
    return 0;
}

/* aligned_bin_counts, and with `with_extrema` aligned_bin_counts_and_extrema. */
static PyObject *bin_counts_call(PyObject *args, int with_extrema) {
    const char *name = with_extrema ? "aligned_bin_counts_and_extrema" : "aligned_bin_counts";
    const char *format = with_extrema ? "OiLO:aligned_bin_counts_and_extrema" : "OiLO:aligned_bin_counts";
    PyObject *values_object, *counts_object;
    int exponent;
    long long first_bin;
    if (!PyArg_ParseTuple(args, format, &values_object, &exponent, &first_bin, &counts_object)) {
        return NULL;
    }
    Py_buffer values, counts;
    if (get_values_and_counts(values_object, counts_object, &values, &counts) != 0) {
        return NULL;
    }
    Py_ssize_t size = counts.len / 8;
    /* The index arithmetic is int32 and float64: keep bins, first_bin and the scale where all are exact
     * (float32 values times 2**-exponent stay normal float64 numbers for |exponent| <= 800). */
    const char *refusal = NULL;
    if (size < 1 || size > INT32_MAX - 1 || first_bin > (1LL << 52) || first_bin < -(1LL << 52) ||
        exponent > 800 || exponent < -800) {
        refusal = "unsupported bins";
    } else if (with_extrema && values.len == 0) {
        refusal = "values must not be empty";
    }
    if (refusal != NULL) {
        PyBuffer_Release(&values);
        PyBuffer_Release(&counts);
        PyErr_Format(PyExc_ValueError, "%s: %s (%zd from %lld, width 2**%d)", name, refusal, size,
                     first_bin, exponent);
        return NULL;
    }
    int64_t zeros = 0;
    float extrema[2] = {0.0f, 0.0f};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = count_bins((const float *)values.buf, values.len / 4, exponent, (int64_t)first_bin,
                        (int64_t *)counts.buf, size, &zeros, with_extrema ? extrema : NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    PyBuffer_Release(&counts);
    if (status == -2) {
        return PyErr_NoMemory();
    }
    if (status != 0 && with_extrema) {
        Py_RETURN_NONE;
    }
    if (status != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "aligned_bin_counts: a value is not finite or lies outside the bins");
        return NULL;
    }
    if (with_extrema) {
        return Py_BuildValue("(Ldd)", (long long)zeros, (double)extrema[0], (double)extrema[1]);
    }
    return PyLong_FromLongLong(zeros);
}

static PyObject *aligned_bin_counts(PyObject *module, PyObject *args) { return bin_counts_call(args, 0); }

static PyObject *aligned_bin_counts_and_extrema(PyObject *module, PyObject *args) {
    return bin_counts_call(args, 1);
}

static PyObject *exponent_field_counts(PyObject *module, PyObject *args) {
    PyObject *values_object, *counts_object;
    if (!PyArg_ParseTuple(args, "OO:exponent_field_counts", &values_object, &counts_object)) {
        return NULL;
    }
    Py_buffer values, counts;
    if (get_values_and_counts(values_object, counts_object, &values, &counts) != 0) {
        return NULL;
    }
    if (counts.len != EXPONENT_FIELDS * 8) {
        PyBuffer_Release(&values);
        PyBuffer_Release(&counts);
        PyErr_SetString(PyExc_ValueError, "exponent_field_counts: counts must have 512 entries");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    count_fields((const uint32_t *)values.buf, values.len / 4, (int64_t *)counts.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    PyBuffer_Release(&counts);
    Py_RETURN_NONE;
}

static PyObject *finite_extrema(PyObject *module, PyObject *values_object) {
    Py_buffer values;
    if (get_buffer(values_object, &values, 'f', "values") != 0) {
        return NULL;
    }
    if (values.len == 0) {
        PyBuffer_Release(&values);
        PyErr_SetString(PyExc_ValueError, "finite_extrema: values must not be empty");
        return NULL;
    }
    float minimum, maximum;
    int special;
    Py_BEGIN_ALLOW_THREADS
    special = extrema_loop((const float *)values.buf, values.len / 4, &minimum, &maximum);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    if (special) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(dd)", (double)minimum, (double)maximum);
}

static PyMethodDef methods[] = {
    {"aligned_bin_counts", aligned_bin_counts, METH_VARARGS,
     "aligned_bin_counts(values, exponent, first_bin, counts) -> zeros: count float32 values into bins of "
     "width 2**exponent starting at bin first_bin; returns the number of zeros."},
    {"aligned_bin_counts_and_extrema", aligned_bin_counts_and_extrema, METH_VARARGS,
     "aligned_bin_counts_and_extrema(values, exponent, first_bin, counts) -> (zeros, minimum, maximum), or "
     "None (counts unchanged) when a value is not finite or lies outside the bins."},
    {"exponent_field_counts", exponent_field_counts, METH_VARARGS,
     "exponent_field_counts(values, counts): count float32 values per bits >> 23 into 512 int64 counts."},
    {"finite_extrema", finite_extrema, METH_O,
     "finite_extrema(values) -> (minimum, maximum), or None when a value is NaN or infinite."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_counting", "The observers' counting loops in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__counting(void) { return PyModule_Create(&module_definition); }
