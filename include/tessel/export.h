/**
 * @file export.h
 * @brief TSL_API, the mark of every public function: the library is built with hidden
 *        visibility, and only what carries this mark is exported from libtessel.
 */
#ifndef TESSEL_EXPORT_H
#define TESSEL_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define TSL_API __attribute__((visibility("default")))
#else
#define TSL_API
#endif

#endif /* TESSEL_EXPORT_H */
