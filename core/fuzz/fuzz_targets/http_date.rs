#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tokenwarden_core::headers::parse_http_date_ms;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let Some(ms) = parse_http_date_ms(&s) else {
        return;
    };
    assert_eq!(ms % 1000, 0, "{s:?} has sub-second precision");
    // Re-format as IMF-fixdate with an independent calendar; it must parse back. The
    // day name is not checked by the parser, so any name will do.
    let c = common::civil(ms);
    let month = common::MONTHS[(c.month - 1) as usize];
    let fixdate = format!(
        "Mon, {:02} {month} {:04} {:02}:{:02}:{:02} GMT",
        c.day, c.year, c.hour, c.minute, c.second
    );
    assert_eq!(parse_http_date_ms(&fixdate), Some(ms), "{s:?} -> {fixdate}");
    let asctime = format!(
        "Mon {month} {:2} {:02}:{:02}:{:02} {:04}",
        c.day, c.hour, c.minute, c.second, c.year
    );
    assert_eq!(parse_http_date_ms(&asctime), Some(ms), "{s:?} -> {asctime}");
});
