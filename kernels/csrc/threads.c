/* A small pool of worker threads for the CPU kernels (specdec_set_num_threads).
 *
 * One parallel region at a time: specdec_parallel_for splits [0, n) into one contiguous
 * share per thread (the caller runs share 0) and returns when every started worker has
 * seen the region, its share done (workers past the region's thread count, left by a
 * lower specdec_set_num_threads, take no share). So no worker can still be on a region
 * once its caller has returned: the region's task, context and thread count are never
 * read stale, whatever the thread count does between regions. Workers
 * spin briefly between regions (a decode step starts dozens of them a millisecond apart),
 * then sleep on a condition variable, so an idle service costs no CPU. Shares never
 * change what is computed, only which thread computes it: results are the same bits for
 * any thread count. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "ops.h"

#define MAX_THREADS 64
#define SPINS 20000 /* about 50 us of polling before a worker sleeps */

static pthread_mutex_t region = PTHREAD_MUTEX_INITIALIZER; /* one region at a time */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static atomic_int num_threads = 1; /* threads a region uses, the caller included */
static int num_started = 1;        /* workers running + 1; they never exit */
static atomic_uint generation;     /* bumped to start a region */
static atomic_int remaining;       /* workers that have not yet finished the current region */
static specdec_task region_task;
static void *region_ctx;
static int64_t region_n;
static int region_threads; /* shares of the current region */

static void run_share(int index, int threads) {
    const int64_t begin = region_n * index / threads, end = region_n * (index + 1) / threads;
    if (begin < end) region_task(region_ctx, begin, end);
}

static inline void relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

/* A worker's index and the generation it was started at (regions before it are not its). */
struct start {
    int index;
    unsigned generation;
};

static void *worker(void *arg) {
    const struct start start = *(struct start *)arg;
    free(arg);
    const int index = start.index;
    unsigned seen = start.generation;
    for (;;) {
        unsigned now;
        int spins = 0;
        while ((now = atomic_load(&generation)) == seen && ++spins < SPINS) relax();
        if (now == seen) {
            pthread_mutex_lock(&wake_lock);
            while ((now = atomic_load(&generation)) == seen) pthread_cond_wait(&wake, &wake_lock);
            pthread_mutex_unlock(&wake_lock);
        }
        seen = now;
        if (index < region_threads) run_share(index, region_threads);
        atomic_fetch_sub(&remaining, 1);
    }
    return NULL;
}

/* Threads for the regions after this call (1: none; capped at MAX_THREADS). Returns the
 * count in effect, which is lower when a worker cannot be started. */
int specdec_set_num_threads(int n) {
    n = n < 1 ? 1 : (n > MAX_THREADS ? MAX_THREADS : n);
    pthread_mutex_lock(&region);
    while (num_started < n) {
        struct start *start = malloc(sizeof *start);
        pthread_t thread;
        if (start == NULL) break;
        *start = (struct start){num_started, atomic_load(&generation)};
        if (pthread_create(&thread, NULL, worker, start) != 0) {
            free(start);
            break;
        }
        pthread_detach(thread);
        ++num_started;
    }
    atomic_store(&num_threads, n < num_started ? n : num_started);
    pthread_mutex_unlock(&region);
    return atomic_load(&num_threads);
}

/* Threads the regions after this call use (the count specdec_set_num_threads put in effect). */
int specdec_num_threads(void) { return atomic_load(&num_threads); }

void specdec_parallel_for(int64_t n, specdec_task task, void *ctx) {
    const int threads = atomic_load(&num_threads);
    if (threads <= 1 || n < 2) {
        if (n > 0) task(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&region);
    region_task = task, region_ctx = ctx, region_n = n;
    region_threads = atomic_load(&num_threads);
    atomic_store(&remaining, num_started - 1);
    pthread_mutex_lock(&wake_lock);
    atomic_fetch_add(&generation, 1);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&wake_lock);
    run_share(0, region_threads);
    while (atomic_load(&remaining) > 0) relax();
    pthread_mutex_unlock(&region);
}

/* A float32 buffer of at least `floats`, the calling thread's own, kept for its next call
 * (a linear's widened or dequantised weights); NULL if memory runs out. */
float *specdec_scratch(size_t floats) {
    static _Thread_local float *buffer;
    static _Thread_local size_t capacity;
    if (floats > capacity) {
        float *grown = realloc(buffer, sizeof(float) * floats);
        if (grown == NULL) return NULL;
        buffer = grown, capacity = floats;
    }
    return buffer;
}
