/* The C SDK's compile-time limits (docs/device-protocol.md, "Limits").
 *
 * The defaults are the protocol's limits, the same in every SDK: a description within them is
 * run by the Python, TypeScript and C SDKs alike, one beyond them is refused by all three
 * (reason unusable). An integrator may define any of these smaller (-DLDP_MAX_LABELS=64 ...)
 * to shrink ldp_state and ldp_ledger; the library then refuses, as unusable, a description that
 * does not fit. Every limit changes the size of the public structs: the library and the code
 * using it must be compiled with the same values (ldp_abi_check() tells them apart at run time).
 *
 * -DLDP_PROFILE_FIRMWARE picks the firmware profile's defaults instead (a state, its scratch
 * copy while a new one is verified and the ledger in under 16 KiB of RAM, state acceptance
 * without the heap: docs/device-protocol.md, "Firmware profile"). Each remains overridable.
 */
#ifndef LDP_LIMITS_H
#define LDP_LIMITS_H

#ifdef LDP_PROFILE_FIRMWARE
#define LDP_DEF_ATTRS 8
#define LDP_DEF_WIDTH 64
#define LDP_DEF_STEPS 16
#define LDP_DEF_TABLES 16
#define LDP_DEF_MATRIX 192
#define LDP_DEF_LABELS 96
#define LDP_DEF_LABEL_BYTES 768
#define LDP_DEF_LEDGER 32
#define LDP_DEF_MEMO 16
#define LDP_DEF_RECORD (16 * 1024)
#define LDP_DEF_RNG_WORDS 128
#define LDP_DEF_ARENA (24 * 1024)
#else
#define LDP_DEF_ATTRS 32
#define LDP_DEF_WIDTH 1024
#define LDP_DEF_STEPS 64
#define LDP_DEF_TABLES 64
#define LDP_DEF_MATRIX 4096
#define LDP_DEF_LABELS 1024
#define LDP_DEF_LABEL_BYTES 16384
#define LDP_DEF_LEDGER 256
#define LDP_DEF_MEMO 256
#define LDP_DEF_RECORD (4 * 1024 * 1024)
#define LDP_DEF_RNG_WORDS 128
#define LDP_DEF_ARENA 0
#endif

#ifndef LDP_MAX_ATTRS
#define LDP_MAX_ATTRS LDP_DEF_ATTRS          /* attributes (<= 255) */
#endif
#ifndef LDP_MAX_WIDTH
#define LDP_MAX_WIDTH LDP_DEF_WIDTH          /* integers in a report (<= 65535) */
#endif
#ifndef LDP_MAX_STEPS
#define LDP_MAX_STEPS LDP_DEF_STEPS          /* steps in all, branches of select included;
                                                 also branches in all (<= 65535) */
#endif
#ifndef LDP_MAX_TABLES
#define LDP_MAX_TABLES LDP_DEF_TABLES        /* partition tables in all (<= 65535) */
#endif
#ifndef LDP_MAX_MATRIX
#define LDP_MAX_MATRIX LDP_DEF_MATRIX        /* matrix entries in all (matrix, copy, keep rows;
                                                 a bloom: values + 1 + positions; a memoize.round
                                                 entry: its points) */
#endif
#ifndef LDP_MAX_LABELS
#define LDP_MAX_LABELS LDP_DEF_LABELS        /* category labels in all */
#endif
#ifndef LDP_LABEL_BYTES
#define LDP_LABEL_BYTES LDP_DEF_LABEL_BYTES  /* UTF-8 bytes of attribute names and labels, one
                                                 more per string (its NUL) */
#endif
#ifndef LDP_LEDGER_CAP
#define LDP_LEDGER_CAP LDP_DEF_LEDGER        /* spends kept in the ledger window */
#endif
#ifndef LDP_MEMO_CAP
#define LDP_MEMO_CAP LDP_DEF_MEMO            /* memoized responses and sent records per
                                                 rotation period */
#endif
#ifndef LDP_MAX_RECORD
#define LDP_MAX_RECORD LDP_DEF_RECORD        /* bytes of a signed ldp.config record */
#endif
#ifndef LDP_OS_RNG_WORDS
#define LDP_OS_RNG_WORDS LDP_DEF_RNG_WORDS   /* words ldp_os_rng buffers per getrandom call */
#endif

#ifndef LDP_PARSE_ARENA
#define LDP_PARSE_ARENA LDP_DEF_ARENA       /* > 0: ldp_state_accept parses in a static arena
                                                 of this many bytes, never the heap; 0: the
                                                 heap (jansson's malloc) */
#endif

/* protocol limits that no build changes */
#define LDP_MAX_CELLS 4294967296ULL          /* cells of a step or table, OLH g^r, codes */
#define LDP_DAY_S 86400.0                    /* a budget day: one UTC calendar day */

#if LDP_MAX_ATTRS > 255 || LDP_MAX_WIDTH > 65535 || LDP_MAX_STEPS > 65535 || \
    LDP_MAX_TABLES > 65535
#error "ldp_limits.h: a limit exceeds the width of the field that holds it"
#endif
#endif
