// Logging macros; spdlog behind them. Library code logs through these only.
#pragma once

#include <spdlog/spdlog.h>

#define KVSPLIT_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define KVSPLIT_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define KVSPLIT_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define KVSPLIT_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
