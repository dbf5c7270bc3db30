/* CDP_API marks a declaration of the public C API (include/cdp/). The library
 * is built with -fvisibility=hidden, so libcdphybrid.so exports these and
 * nothing else: what a program may call is what these headers declare. */
#ifndef CDP_API_H
#define CDP_API_H

#if defined(__GNUC__) || defined(__clang__)
#define CDP_API __attribute__((visibility("default")))
#else
#define CDP_API
#endif

#endif
