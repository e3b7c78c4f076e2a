/* libpsworker: PS_API, the mark of a function the library exports.
 *
 * libpsworker is built with -fvisibility=hidden, so its dynamic symbol
 * table holds exactly the functions whose declaration in these public
 * headers carries PS_API: every one of them, and nothing else (the
 * install test checks both ways).  As NNG_DECL and UV_EXTERN do, PS_API
 * is default visibility under GCC and Clang and empty elsewhere. */
#ifndef PARAMSERVER_API_H
#define PARAMSERVER_API_H

#if defined(__GNUC__) || defined(__clang__)
#define PS_API __attribute__((visibility("default")))
#else
#define PS_API
#endif

#endif
