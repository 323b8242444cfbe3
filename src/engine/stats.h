/* Flow-control statistics (how long submits stalled on a full ring, how
 * full each ring got) and the printed report with sizing advice. The
 * counters live where they are produced (rings, scheduler, orchestrator);
 * this gathers and explains them. */
#ifndef PTO_STATS_H
#define PTO_STATS_H
#include "pto.h"
#endif
