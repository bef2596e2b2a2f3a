/* The entropy search's per-candidate screen in C: entropy.py's `_candidates` and `_estimates` for one
 * histogram, in loops instead of a few hundred small numpy calls: 0.3 ms with AVX-512 (0.45 ms with
 * AVX2) against numpy's 1.5 ms per histogram of a BERT encoder's (~1200 bins, Q = 128; about 123 K
 * logarithms), and without the GIL, so that two threads search at once. The loops over Q are written for
 * gcc to vectorise them, the logarithms included (`vector_log`): with libm's log, one call per value, it
 * took 0.75 ms. Built for x86-64 without AVX2 (or by a compiler without target_clones) it takes 0.9 ms.
 *
 * entropy_screen(histogram, num_quantized_bins, depth, starts, lengths, merged,
 *                p_correction, p_first, p_last, q_values, ok, estimates, bounds)
 *     Inputs: the int64 counts, Q, numpy's pairwise-sum depth bound for the widest row, and per candidate
 *     its first bin, length and merged size (int64). Outputs, per candidate: p's smoothing correction and
 *     smoothed end bins, q's smoothed values (Q + 1 float32 per row, the tail's last), whether onnxruntime
 *     could smooth p and q (bool), and the screen's KL estimate and error bound (float64; 0 and inf where
 *     the screen does not apply).
 *
 * The float32 outputs feed the exact KL rows, so they repeat numpy's operations one for one: int64 counts
 * converted to float64 for quotients, float64 corrections rounded to float32, float32 additions. The
 * estimates only need to stay within their bound (entropy.py's note): the sums here run in another order
 * than numpy's, and the logarithms of q are `vector_log`'s, which the bound's float64 term covers.
 * tests/calibrate/test_entropy_speed.py compares both implementations: the float32 outputs bit for bit,
 * the estimates within 1e-12 (they differ by up to 1e-14 on a BERT encoder's histograms).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SMOOTHING_EPSILON 1e-4

/* As _counting.c: a baseline, an AVX2 and an AVX-512 build of the candidates' loop, picked at load time. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
#define VECTOR_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define VECTOR_CLONES
#endif

/* Partial sums per candidate: the sums over its Q merged bins run in this many lanes, which gcc keeps
 * in one vector register each. */
enum { SUM_LANES = 8 };

/* log(x) of a positive normal double: x = 2**e * m with m in [sqrt(1/2), sqrt(2)), and
 * log m = 2 atanh(s) = 2 (s + s**3/3 + ... + s**19/19), s = (m - 1) / (m + 1), |s| <= 0.1716 (the next
 * term is below 2**-55 of the sum). Within 1e-15 * (|log x| + 1): what the estimates need (the note in
 * entropy.py), in a branch-free form that gcc vectorises where libm's log is one call per value (45% of
 * the screen's time went there). */
static inline double vector_log(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint64_t mantissa_bits = (bits & 0x000FFFFFFFFFFFFFULL) | 0x3FF0000000000000ULL;
    double m;
    memcpy(&m, &mantissa_bits, sizeof m);
    const int high = m > 1.4142135623730951;
    m = high ? 0.5 * m : m;
    /* int32: AVX2 has no vector int64 -> double conversion, and without one gcc leaves the loop scalar */
    const double exponent = (double)((int32_t)(bits >> 52) - 1023 + high);
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double series = 1.0 / 19;
    series = series * s2 + 1.0 / 17;
    series = series * s2 + 1.0 / 15;
    series = series * s2 + 1.0 / 13;
    series = series * s2 + 1.0 / 11;
    series = series * s2 + 1.0 / 9;
    series = series * s2 + 1.0 / 7;
    series = series * s2 + 1.0 / 5;
    series = series * s2 + 1.0 / 3;
    series = series * s2 + 1.0;
    return exponent * 0.6931471805599453 + 2.0 * s * series;
}

/* onnxruntime's q value of a merged bin: trunc(sum / norm) in float64, 0 where the norm is 0. */
static double quotient(double sum, double norm) { /* the int64 counts converted as onnxruntime does */
    return norm != 0.0 ? trunc(sum / (norm > 1.0 ? norm : 1.0)) : 0.0;
}

/* float32(-1e-4 * zeros / non-zeros), the quotient in float64 as in Python. */
static float correction(int64_t zeros, int64_t length) {
    const int64_t nonzeros = length - zeros > 1 ? length - zeros : 1;
    return (float)(-((SMOOTHING_EPSILON * (double)zeros) / (double)nonzeros));
}

/* entropy.py's `_smooth` of one float32 count. */
static float smooth(float count, float shift) {
    const float epsilon = (float)SMOOTHING_EPSILON;
    if (1.0f + shift < epsilon) {
        return count == 0.0f ? epsilon : count + shift;
    }
    const float value = count + shift;
    return value > epsilon ? value : epsilon;
}

/* entropy.py's `_smoothed` of one int64 count (no floor at epsilon). */
static float smoothed(int64_t count, float shift) {
    return count == 0 ? (float)SMOOTHING_EPSILON : (float)count + shift;
}

typedef struct {
    const int64_t *histogram, *prefix, *nonzero_prefix, *zero_prefix;
    const double *g_prefix, *slope_prefix, *curvature_prefix;
    Py_ssize_t num_bins;
} Tables;

static int64_t run_sum(const Tables *t, int64_t first, int64_t size) {
    return t->prefix[first + size] - t->prefix[first];
}

static int64_t run_nonzeros(const Tables *t, int64_t first, int64_t size) {
    return t->nonzero_prefix[first + size] - t->nonzero_prefix[first];
}

typedef struct {
    float *p_correction, *p_first, *p_last, *q_values;
    char *ok;
    double *estimates, *bounds;
} Outputs;

/* Q doubles each: q's merged bins before smoothing, the merged bins' sums and non-zero counts, log q. */
typedef struct {
    double *spread, *sums, *norms, *log_q;
} Scratch;

/* One candidate: `_candidates` then `_estimates` for row c. */
VECTOR_CLONES
static void screen_candidate(const Tables *t, int64_t quantized, int64_t depth, Py_ssize_t c, int64_t start,
                             int64_t length, int64_t merged, const Scratch *scratch, const Outputs *out) {
    const int64_t *h = t->histogram, *prefix = t->prefix, *nz = t->nonzero_prefix;
    const int64_t end = start + length;
    const int has_last = length > 1;

    /* p's end bins with the outside counts folded in, and p's zero count. */
    const int64_t first_bin = h[start] + prefix[start];
    const int64_t last_bin = (has_last ? h[end - 1] : first_bin) + (prefix[t->num_bins] - prefix[end]);
    const int64_t first_changed = (int64_t)((has_last ? first_bin : last_bin) == 0) - (h[start] == 0);
    const int64_t last_changed = has_last ? (int64_t)(last_bin == 0) - (h[end - 1] == 0) : 0;
    const int64_t p_zeros = t->zero_prefix[end] - t->zero_prefix[start] + first_changed + last_changed;

    /* q: merged bin j sums bins [start + j·merged, start + (j+1)·merged); the first and last are redone
     * with p's end bins and the tail. */
    const int64_t tail = length - quantized * merged;
    double *spread = scratch->spread, *sums = scratch->sums, *norms = scratch->norms, *log_q = scratch->log_q;
    for (int64_t j = 0; j < quantized; j++) { /* merged = 0 leaves empty runs: sums, norms and q's 0 */
        const int64_t first = start + j * merged;
        sums[j] = (double)run_sum(t, first, merged);
        norms[j] = (double)run_nonzeros(t, first, merged);
        spread[j] = quotient(sums[j], norms[j]);
    }
    const int64_t last_start = start + (quantized - 1) * merged;
    int64_t last_norm = run_nonzeros(t, last_start, merged) - (tail == 0 ? last_changed : 0);
    if (quantized == 1) {
        last_norm -= first_changed;
    } else {
        spread[0] = quotient((double)run_sum(t, start, merged),
                             (double)(run_nonzeros(t, start, merged) - first_changed));
    }
    spread[quantized - 1] = quotient((double)(prefix[end] - prefix[last_start]), (double)last_norm);
    int64_t q_zeros = tail;
    for (int64_t j = 0; j < quantized; j++) {
        q_zeros += spread[j] == 0.0 ? merged : 0;
    }

    const float epsilon32 = (float)SMOOTHING_EPSILON;
    const float p_shift = correction(p_zeros, length), q_shift = correction(q_zeros, length);
    float *q = out->q_values + c * (quantized + 1);
    int64_t q_nonpositive = 0;
    for (int64_t j = 0; j < quantized; j++) {
        q[j] = smooth((float)spread[j], q_shift);
        q_nonpositive += q[j] <= 0.0f;
    }
    q[quantized] = epsilon32;
    const float p_first = smoothed(first_bin, p_shift), p_last = smoothed(last_bin, p_shift);
    const int ok = p_zeros < length && q_zeros < length;
    out->p_correction[c] = p_shift;
    out->p_first[c] = p_first;
    out->p_last[c] = p_last;
    out->ok[c] = (char)ok;

    /* The estimate: KL = (Σp·log p - Σp·log q) / P - log P + log T, from prefix sums (`_estimates`). */
    const double epsilon = (double)epsilon32, shift = (double)p_shift, log_epsilon = log(epsilon);
    const int64_t tail_start = start + quantized * merged;
#define P_SUM(first, stop)                                                                              \
    ((double)(prefix[stop] - prefix[first]) + (shift - epsilon) * (double)(nz[stop] - nz[first]) +      \
     epsilon * (double)((stop) - (first)))
    const int64_t raw_first = h[start], raw_last = h[end - 1];
    const double first_extra = (double)p_first - (raw_first == 0 ? epsilon : (double)raw_first + shift);
    const double last_extra = (double)p_last - (raw_last == 0 ? epsilon : (double)raw_last + shift);
    const double p_total = P_SUM(start, end) + first_extra + last_extra;
    /* log q only where every q is positive (else the screen does not apply, below) */
    if (q_nonpositive == 0) {
        for (int64_t j = 0; j < quantized; j++) {
            log_q[j] = vector_log((double)q[j]);
        }
    } else {
        memset(log_q, 0, (size_t)quantized * sizeof(double));
    }
    /* q, log q, and log q times the runs' sums and non-zero counts, summed in lanes */
    double q_lanes[SUM_LANES] = {0.0}, log_lanes[SUM_LANES] = {0.0};
    double sum_lanes[SUM_LANES] = {0.0}, count_lanes[SUM_LANES] = {0.0};
    const int64_t whole = quantized - quantized % SUM_LANES;
    for (int64_t j = 0; j < whole; j += SUM_LANES) {
        for (int lane = 0; lane < SUM_LANES; lane++) {
            q_lanes[lane] += (double)q[j + lane];
            log_lanes[lane] += log_q[j + lane];
            sum_lanes[lane] += log_q[j + lane] * sums[j + lane];
            count_lanes[lane] += log_q[j + lane] * norms[j + lane];
        }
    }
    for (int64_t j = whole; j < quantized; j++) {
        q_lanes[0] += (double)q[j];
        log_lanes[0] += log_q[j];
        sum_lanes[0] += log_q[j] * sums[j];
        count_lanes[0] += log_q[j] * norms[j];
    }
    double q_sum = 0.0, log_q_sum = 0.0, run_sums = 0.0, run_counts = 0.0;
    for (int lane = 0; lane < SUM_LANES; lane++) {
        q_sum += q_lanes[lane];
        log_q_sum += log_lanes[lane];
        run_sums += sum_lanes[lane];
        run_counts += count_lanes[lane];
    }
    const double q_total = (double)merged * q_sum + epsilon * (double)tail;
    double p_log_q = log_epsilon * P_SUM(tail_start, end) + epsilon * (double)merged * log_q_sum;
    p_log_q += run_sums + (shift - epsilon) * run_counts;
    const double tail_log_q = tail_start == end ? log((double)q[quantized - 1]) : log_epsilon;
    p_log_q += first_extra * log((double)q[0]) + last_extra * tail_log_q;
#undef P_SUM
    /* Σ g(p) over the inner bins (start, end - 1), g(x) = x·log x to second order in the correction, and
     * the two end bins. */
    const int64_t inner_first = start + 1, inner_end = end - 1;
    const int64_t inner_nonzeros = nz[inner_end] - nz[inner_first];
    const int64_t inner_zeros = length - 2 - inner_nonzeros;
    double p_log_p = t->g_prefix[inner_end] - t->g_prefix[inner_first] +
                     shift * (t->slope_prefix[inner_end] - t->slope_prefix[inner_first]) +
                     shift * shift / 2 * (t->curvature_prefix[inner_end] - t->curvature_prefix[inner_first]) +
                     (double)inner_zeros * (epsilon * log_epsilon);
    p_log_p += (double)p_first * log((double)p_first) + (double)p_last * log((double)p_last);
    const double estimate = (p_log_p - p_log_q) / p_total - log(p_total) + log(q_total);
    const double entropy = log(p_total) - p_log_p / p_total;

    const double magnitude = fabs(shift);
    const double remainder =
        magnitude * magnitude * magnitude / (6 * (1 - magnitude) * (1 - magnitude)) * (double)inner_nonzeros / p_total;
    const double screen = remainder + (double)(t->num_bins + quantized + 8) * ldexp(1.0, -40);
    const double weighted = 2 * (entropy + screen) + estimate + screen;
    const double bound =
        2 * ldexp(1.0, -24) * ((double)(2 * depth + 14) * weighted + (double)(2 * depth + 11)) + screen;
    const int applies = ok && magnitude <= 0.5 && length >= 2 && merged >= 1 && q_nonpositive == 0 &&
                        p_first > 0.0f && p_last > 0.0f && isfinite(estimate) && isfinite(bound);
    out->estimates[c] = applies ? estimate : 0.0;
    out->bounds[c] = applies ? bound : INFINITY;
}

/* Prefix sums over the histogram, the candidates' loop; 0, or -1 when memory runs out. */
static int screen(const int64_t *histogram, Py_ssize_t num_bins, int64_t quantized, int64_t depth,
                  const int64_t *starts, const int64_t *lengths, const int64_t *merged, Py_ssize_t count,
                  const Outputs *out) {
    const size_t size = (size_t)num_bins + 1;
    int64_t *integers = calloc(3 * size, sizeof(int64_t));
    double *reals = calloc(3 * size + 4 * (size_t)quantized, sizeof(double));
    if (integers == NULL || reals == NULL) {
        free(integers);
        free(reals);
        return -1;
    }
    Tables t = {histogram, integers, integers + size, integers + 2 * size, reals, reals + size, reals + 2 * size,
                num_bins};
    int64_t *prefix = integers, *nonzero_prefix = integers + size, *zero_prefix = integers + 2 * size;
    double *g_prefix = reals, *slope_prefix = reals + size, *curvature_prefix = reals + 2 * size;
    for (Py_ssize_t k = 0; k < num_bins; k++) {
        const int64_t count_k = histogram[k];
        const int nonzero = count_k != 0;
        const double log_k = nonzero ? log((double)count_k) : 0.0;
        prefix[k + 1] = prefix[k] + count_k;
        nonzero_prefix[k + 1] = nonzero_prefix[k] + nonzero;
        zero_prefix[k + 1] = zero_prefix[k] + !nonzero;
        g_prefix[k + 1] = g_prefix[k] + (nonzero ? (double)count_k * log_k : 0.0);
        slope_prefix[k + 1] = slope_prefix[k] + (nonzero ? log_k + 1.0 : 0.0);
        curvature_prefix[k + 1] = curvature_prefix[k] + (nonzero ? 1.0 / (double)count_k : 0.0);
    }
    double *scratch_start = reals + 3 * size;
    const Scratch scratch = {scratch_start, scratch_start + quantized, scratch_start + 2 * quantized,
                             scratch_start + 3 * quantized};
    for (Py_ssize_t c = 0; c < count; c++) {
        screen_candidate(&t, quantized, depth, c, starts[c], lengths[c], merged[c], &scratch, out);
    }
    free(integers);
    free(reals);
    return 0;
}

/* Buffers: C-contiguous, of one item kind and `items` items (or any count when items < 0). */
static int get_buffer(PyObject *object, Py_buffer *view, char kind, Py_ssize_t items, const char *name) {
    const int writable = kind == 'f' || kind == 'd' || kind == '?';
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) !=
        0) {
        return -1;
    }
    const char *format = view->format;
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') {
        format++;
    }
    const char code = format[1] == '\0' ? format[0] : 0;
    const Py_ssize_t itemsize = kind == 'q' || kind == 'd' ? 8 : kind == 'f' ? 4 : 1;
    /* numpy writes int64 as 'l' on LP64 platforms and 'q' elsewhere */
    const int same = kind == 'q' ? code == 'q' || code == 'l' : code == kind;
    if (!same || view->itemsize != itemsize || (items >= 0 && view->len != items * itemsize)) {
        PyErr_Format(PyExc_ValueError, "entropy_screen: %s has format '%s' and %zd bytes", name, view->format,
                     view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *entropy_screen(PyObject *module, PyObject *args) {
    PyObject *objects[12];
    long long quantized, depth;
    if (!PyArg_ParseTuple(args, "OLLOOOOOOOOOO:entropy_screen", &objects[0], &quantized, &depth, &objects[1],
                          &objects[2], &objects[3], &objects[4], &objects[5], &objects[6], &objects[7],
                          &objects[8], &objects[9], &objects[10])) {
        return NULL;
    }
    static const char kinds[11] = {'q', 'q', 'q', 'q', 'f', 'f', 'f', 'f', '?', 'd', 'd'};
    static const char *names[11] = {"histogram", "starts", "lengths", "merged", "p_correction", "p_first",
                                    "p_last", "q_values", "ok", "estimates", "bounds"};
    Py_buffer views[11];
    int taken = 0, status = 0;
    Py_ssize_t count = -1;
    for (; taken < 11; taken++) {
        /* the histogram: any length; the rest: one item per candidate (q_values: Q + 1) */
        Py_ssize_t items = taken == 0 ? -1 : taken == 7 ? count * (Py_ssize_t)(quantized + 1) : count;
        if (taken == 7 && (quantized < 1 || quantized > 1 << 20)) {
            PyErr_Format(PyExc_ValueError, "entropy_screen: num_quantized_bins %lld", quantized);
            break;
        }
        if (get_buffer(objects[taken], &views[taken], kinds[taken], items, names[taken]) != 0) {
            break;
        }
        if (taken == 1) {
            count = views[1].len / 8;
        }
    }
    if (taken == 11) {
        const Py_ssize_t num_bins = views[0].len / 8;
        const int64_t *starts = views[1].buf, *lengths = views[2].buf, *merged = views[3].buf;
        for (Py_ssize_t c = 0; c < count; c++) { /* every window inside the histogram, merged as defined */
            if (starts[c] < 0 || lengths[c] < 1 || lengths[c] > num_bins - starts[c] || /* no overflow */
                merged[c] != lengths[c] / quantized) {
                PyErr_Format(PyExc_ValueError, "entropy_screen: candidate %zd is outside the histogram", c);
                status = -1;
                break;
            }
        }
        if (status == 0) {
            Outputs out = {views[4].buf, views[5].buf, views[6].buf, views[7].buf, views[8].buf, views[9].buf,
                           views[10].buf};
            Py_BEGIN_ALLOW_THREADS
            status = screen(views[0].buf, num_bins, quantized, depth, starts, lengths, merged, count, &out);
            Py_END_ALLOW_THREADS
            if (status != 0) {
                PyErr_NoMemory();
            }
        }
    }
    for (int k = 0; k < taken; k++) {
        PyBuffer_Release(&views[k]);
    }
    if (taken < 11 || status != 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"entropy_screen", entropy_screen, METH_VARARGS,
     "entropy_screen(histogram, Q, depth, starts, lengths, merged, p_correction, p_first, p_last, q_values, "
     "ok, estimates, bounds): the entropy search's per-candidate screen into the output buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_entropy_screen", "The entropy search's per-candidate screen in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__entropy_screen(void) { return PyModule_Create(&module_definition); }
