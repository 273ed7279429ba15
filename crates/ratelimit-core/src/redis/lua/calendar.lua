-- Calendar periods (Policy::calendar): fixed windows whose edges are the
-- calendar's, in UTC or at a fixed offset from it. The reference is
-- Calendar::bounds in Rust (crates/ratelimit-core/src/algorithm/calendar.rs).
--
-- A fixed window's second parameter above CALENDAR names calendar periods
-- instead of a window length (at most 2^50 µs): CALENDAR + period * 10^6 +
-- 100000 + offset, the period 1 (day), 2 (ISO week, from Monday), 3 (month)
-- or 4 (year), the offset in seconds east of UTC (less than a day either
-- way). Every number here is an exact integer for times below 2^53 µs less
-- a day (the year 2255): every division is floored by idiv (numbers.lua),
-- negative numerators included, `%` is Lua's floored modulo on small
-- integers, and the edges are whole seconds, multiples of 2^6 µs.
local CALENDAR = 2251799813685248 -- 2^51
local DAY_MICROS = 86400000000

-- The period that holds `now` (µs of Unix time) under the parameter `code`:
-- its first µs (never below 0) and the first µs after it. The civil-date
-- arithmetic is Howard Hinnant's days_from_civil and civil_from_days, in
-- the proleptic Gregorian calendar; one closure, its helper made only when
-- a calendar policy asks.
local function calendar_window(now, code)
  code = code - CALENDAR
  local period = idiv(code, 1000000)
  local offset = (code - period * 1000000 - 100000) * 1000000
  local day = idiv(now + offset, DAY_MICROS)
  local first, after
  if period == 1 then
    first, after = day, day + 1
  elseif period == 2 then
    -- 1970-01-01 was a Thursday: its Monday is 3 days before.
    first = day - (day + 3) % 7
    after = first + 7
  else
    -- The days since 1970-01-01 of year-month-1.
    local function first_of(year, month)
      if month <= 2 then
        year = year - 1
      end
      local era = idiv(year, 400)
      local yoe = year - era * 400
      local doy = idiv(153 * ((month + 9) % 12) + 2, 5)
      return era * 146097 + yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy - 719468
    end
    -- civil_from_days: the year and month of `day`.
    local z = day + 719468
    local era = idiv(z, 146097)
    local doe = z - era * 146097
    local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
    local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
    local mp = idiv(5 * doy + 2, 153)
    local month = mp + 3
    if month > 12 then
      month = month - 12
    end
    local year = yoe + era * 400
    if month <= 2 then
      year = year + 1
    end
    if period == 3 then
      first = first_of(year, month)
      if month == 12 then
        after = first_of(year + 1, 1)
      else
        after = first_of(year, month + 1)
      end
    else
      first, after = first_of(year, 1), first_of(year + 1, 1)
    end
  end
  local start = first * DAY_MICROS - offset
  if start < 0 then
    start = 0
  end
  return start, after * DAY_MICROS - offset
end

-- The fixed window that holds `t`: its first µs and the first µs after it,
-- for a `window` in µs, or for calendar periods (above CALENDAR).
local function fixed_window_bounds(t, window)
  if window > CALENDAR then
    return calendar_window(t, window)
  end
  local start = idiv(t, window) * window
  return start, start + window
end
