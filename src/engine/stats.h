/* Flow-control statistics (seed 002 §Stall Tracking) and the printed
 * report with sizing advice. The counters live where they are produced
 * (rings, scheduler, orchestrator); this gathers and explains them. */
#ifndef PTO_STATS_H
#define PTO_STATS_H
#include "pto.h"
#endif
