/**
 * @file tessel.h
 * @brief Umbrella header of the tessel public API (everything but the embedding header
 *        tessel/starpu.h).
 */
#ifndef TESSEL_TESSEL_H
#define TESSEL_TESSEL_H

#include "tessel/export.h"
#include "tessel/status.h"
#include "tessel/context.h"
#include "tessel/tensor.h"
#include "tessel/io.h"
#include "tessel/data.h"
#include "tessel/ops.h"
#include "tessel/graph.h"
#include "tessel/plan.h"
#include "tessel/model.h"
#include "tessel/version.h"

#endif /* TESSEL_TESSEL_H */
