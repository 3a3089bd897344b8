/* SPDX-License-Identifier: Apache-2.0 */
/* The core's extent allocator (lib/core/extent.c): random allocations,
 * frees and growth checked against a granule ownership map, the free-list
 * invariants after every step, and the refusals (double free, out of
 * range, zero length, too large). */
#include "zo_test.h"

#include "core/internal.h"
#include "core/extent.h"

START_TEST(test_extent_random)
{
    enum { G = 4096, SLOTS = 256 };
    zo__extalloc a;
    ck_assert_int_eq(zo__ext_init(&a, 1024 * G, G), 0);
    uint16_t owner[2048]; /* granule -> allocation id + 1 (0 = free) */
    memset(owner, 0, sizeof(owner));
    struct {
        uint64_t off, len;
    } live[SLOTS];
    memset(live, 0, sizeof(live));
    zo_test_rng rng = {zo_test_seed() ^ 1};
    uint64_t size = 1024 * G;
    for (int step = 0; step < 20000; step++) {
        unsigned k = (unsigned)(zo_test_next(&rng) % SLOTS);
        if (live[k].len) {
            ck_assert_int_eq(zo__ext_free(&a, live[k].off, live[k].len), 0);
            for (uint64_t g = live[k].off / G; g < (live[k].off + zo__ext_round(&a, live[k].len)) / G; g++) {
                ZO_EXPECT(owner[g] == k + 1, "granule %llu owner %u, expected %u", (unsigned long long)g, owner[g],
                          k + 1);
                owner[g] = 0;
            }
            live[k].len = 0;
        } else {
            uint64_t len = 1 + zo_test_next(&rng) % (24 * G);
            uint64_t align = 1ull << (12 + zo_test_next(&rng) % 5);
            uint64_t off;
            int r = zo__ext_alloc(&a, len, align, &off);
            if (r == -ENOSPC) {
                /* it must really not fit: no aligned free run of that many granules */
                uint64_t need = zo__ext_round(&a, len) / G;
                for (uint64_t g = 0; g + need <= size / G; g += align / G) {
                    uint64_t j = 0;
                    while (j < need && owner[g + j] == 0)
                        j++;
                    ZO_EXPECT(j < need, "ENOSPC but granules %llu..+%llu are free", (unsigned long long)g,
                              (unsigned long long)need);
                }
                if (size < 2048 * G && (zo_test_next(&rng) & 1)) {
                    ck_assert_int_eq(zo__ext_grow(&a, size + 64 * G), 0);
                    size += 64 * G;
                }
                continue;
            }
            ck_assert_int_eq(r, 0);
            ck_assert_uint_eq(off % align, 0);
            ck_assert_uint_le(off + len, size);
            for (uint64_t g = off / G; g < (off + zo__ext_round(&a, len)) / G; g++) {
                ZO_EXPECT(owner[g] == 0, "granule %llu given twice", (unsigned long long)g);
                owner[g] = (uint16_t)(k + 1);
            }
            live[k].off = off;
            live[k].len = len;
        }
        ZO_EXPECT(zo__ext_check(&a) == 0, "invariants broken at step %d", step);
    }
    /* double free and out-of-range are refused */
    uint64_t off;
    for (unsigned k = 0; k < SLOTS; k++)
        if (live[k].len)
            ck_assert_int_eq(zo__ext_free(&a, live[k].off, live[k].len), 0);
    ck_assert_uint_eq(a.used, 0);
    ck_assert_uint_eq(zo__ext_largest(&a), size);
    ck_assert_int_eq(zo__ext_alloc(&a, G, G, &off), 0);
    ck_assert_int_eq(zo__ext_free(&a, off, G), 0);
    ck_assert_int_eq(zo__ext_free(&a, off, G), -EINVAL);
    ck_assert_int_eq(zo__ext_free(&a, size, G), -EINVAL);
    ck_assert_int_eq(zo__ext_alloc(&a, 0, G, &off), -EINVAL);
    ck_assert_int_eq(zo__ext_alloc(&a, size + G, G, &off), -ENOSPC);
    zo__ext_fini(&a);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("extent");
    TCase *tc = tcase_create("extent");
    tcase_add_test(tc, test_extent_random);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
