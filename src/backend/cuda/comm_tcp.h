// The TCP rendezvous moved to backend/cpu/cpu_comm_tcp.h (2026-12-01): the
// CPU multi-process communicator and the engine's control channel use it
// too, in builds without CUDA. This header keeps the old include working.
#pragma once
#include "backend/cpu/cpu_comm_tcp.h"
