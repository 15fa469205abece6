//! Numbers: unsigned parsing for addresses and sizes, and printing that
//! matches CPython (`str(int)` and `float.__repr__`).

use core::fmt::Write as _;

use super::lex::NumberToken;
use super::sink::Sink;

/// "00" to "99": two digits per division when printing.
const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes `v` in decimal.
///
/// The digits go straight into the output (a stack buffer copied out
/// would be read back before its small stores land), from the right, eight
/// at a time: one 64-bit division splits off each group of eight, whose
/// four pairs then come from 32-bit arithmetic that does not wait on the
/// next group.
#[inline]
pub fn write_u64(out: &mut Sink<'_>, v: u64) {
    // Most of a manifest's numbers are small dimensions: one or two bytes.
    if v < 10 {
        return out.byte(b'0' + v as u8);
    }
    if v < 100 {
        let at = v as usize * 2;
        return out.put(&PAIRS[at..at + 2]);
    }
    write_long(out, v);
}

/// [`write_u64`] for 100 and above.
fn write_long(out: &mut Sink<'_>, v: u64) {
    let len = v.checked_ilog10().map_or(1, |l| l as usize + 1);
    if let Some(dst) = out.spare(len) {
        let mut i = len;
        let mut n = v;
        while n >= 100_000_000 {
            let group = (n % 100_000_000) as u32;
            n /= 100_000_000;
            i -= 8;
            let (hi, lo) = (group / 10_000, group % 10_000);
            put_pair(dst, i, hi / 100);
            put_pair(dst, i + 2, hi % 100);
            put_pair(dst, i + 4, lo / 100);
            put_pair(dst, i + 6, lo % 100);
        }
        // Under 10^8: fits 32 bits.
        let mut n = n as u32;
        while i >= 2 {
            i -= 2;
            put_pair(dst, i, n % 100);
            n /= 100;
        }
        if i == 1 {
            dst[0] = b'0' + n as u8;
        }
    }
    out.advance(len);
}

/// The two digits of `pair` (below 100) at `dst[i..i + 2]`.
#[inline(always)]
fn put_pair(dst: &mut [u8], i: usize, pair: u32) {
    let at = pair as usize * 2;
    dst[i..i + 2].copy_from_slice(&PAIRS[at..at + 2]);
}

/// Why a number token is not a `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum U64Error {
    Negative,
    TooLarge,
    NotAnInteger,
}

/// Parses an integer token as `u64`. `-0` is zero, as it is in Python.
#[inline]
pub(crate) fn parse_u64(tok: NumberToken<'_>) -> Result<u64, U64Error> {
    if !tok.is_integer {
        return Err(U64Error::NotAnInteger);
    }
    let (negative, digits) = match tok.text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, tok.text),
    };
    let v = parse_digits(digits.as_bytes());
    match (negative, v) {
        (false, Some(v)) | (true, Some(v @ 0)) => Ok(v),
        (false, None) => Err(U64Error::TooLarge),
        (true, _) => Err(U64Error::Negative),
    }
}

/// The value of ASCII digits (no sign, no leading zeros but for "0"), or
/// `None` above `u64::MAX`. Eight digits at a time (SWAR), since addresses
/// and sizes are mostly 6 to 15 digits long.
#[inline]
fn parse_digits(d: &[u8]) -> Option<u64> {
    if d.len() > 20 {
        return None;
    }
    let (head, body) = d.split_at(d.len() % 8);
    let mut v: u64 = 0;
    for &c in head {
        v = v * 10 + u64::from(c.wrapping_sub(b'0'));
    }
    for chunk in body.chunks_exact(8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        v = v
            .checked_mul(100_000_000)?
            .checked_add(parse_8_digits(u64::from_le_bytes(w)))?;
    }
    Some(v)
}

/// Eight ASCII digits, first digit in the lowest byte, to their value.
#[inline]
fn parse_8_digits(w: u64) -> u64 {
    let v = w.wrapping_sub(0x3030_3030_3030_3030);
    let v = (v.wrapping_mul(10) + (v >> 8)) & 0x00ff_00ff_00ff_00ff;
    let v = (v.wrapping_mul(100) + (v >> 16)) & 0x0000_ffff_0000_ffff;
    (v.wrapping_mul(10_000) + (v >> 32)) & 0xffff_ffff
}

/// A fixed stack buffer for `core::fmt` output.
struct StackBuf {
    buf: [u8; 40],
    len: usize,
}

impl core::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(core::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Writes `v` as CPython's `json.dumps` does: `repr(float)` (shortest
/// round-trip digits; scientific notation when the decimal exponent is below
/// -4 or at least 16) and `NaN`, `Infinity`, `-Infinity`.
pub fn write_f64(out: &mut Sink<'_>, v: f64) {
    if v.is_nan() {
        return out.put(b"NaN");
    }
    if v.is_infinite() {
        return out.put(if v > 0.0 { b"Infinity" } else { b"-Infinity" });
    }
    // `{:e}` gives the shortest round-trip digit count, as Python's repr
    // does ("-1.2345e-7", "1e16", "0e0"); when two strings of that length
    // round-trip equally well, Rust and Python may pick different ones.
    // Python's is the correctly rounded one (ties to even), which is what
    // `{:.N e}` prints, so print again at that precision.
    let mut sb = StackBuf {
        buf: [0; 40],
        len: 0,
    };
    if write!(sb, "{v:e}").is_err() {
        return;
    }
    let shortest = sb.buf[..sb.len]
        .iter()
        .take_while(|&&b| b != b'e')
        .filter(|b| b.is_ascii_digit())
        .count();
    sb.len = 0;
    if write!(sb, "{v:.*e}", shortest.saturating_sub(1)).is_err() {
        return;
    }
    let s = &sb.buf[..sb.len];
    let (negative, s) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    let epos = s.iter().position(|&b| b == b'e').unwrap_or(s.len());
    let (mantissa, exp_part) = s.split_at(epos);
    let exp: i32 = exp_part
        .get(1..)
        .and_then(|e| core::str::from_utf8(e).ok())
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let mut digits = [0u8; 20];
    let mut n = 0;
    for &b in mantissa.iter().filter(|b| b.is_ascii_digit()) {
        if let Some(d) = digits.get_mut(n) {
            *d = b;
            n += 1;
        }
    }
    let digits = &digits[..n];
    if negative {
        out.byte(b'-');
    }
    if !(-4..16).contains(&exp) {
        out.put(&digits[..1]);
        if digits.len() > 1 {
            out.byte(b'.');
            out.put(&digits[1..]);
        }
        out.byte(b'e');
        out.byte(if exp < 0 { b'-' } else { b'+' });
        let e = exp.unsigned_abs();
        if e < 10 {
            out.byte(b'0');
        }
        write_u64(out, u64::from(e));
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.put(digits);
            for _ in digits.len()..int_len {
                out.byte(b'0');
            }
            out.put(b".0");
        } else {
            out.put(&digits[..int_len]);
            out.byte(b'.');
            out.put(&digits[int_len..]);
        }
    } else {
        out.put(b"0.");
        for _ in 0..(-exp - 1) {
            out.byte(b'0');
        }
        out.put(digits);
    }
}

/// Writes a number token as CPython would after `json.loads`: integers keep
/// their digits (`-0` becomes `0`), everything else goes through `float`.
pub(crate) fn write_canonical_number(out: &mut Sink<'_>, tok: NumberToken<'_>) {
    if tok.is_integer {
        let t = tok.text;
        if t.strip_prefix('-')
            .is_some_and(|d| d.bytes().all(|b| b == b'0'))
        {
            out.byte(b'0');
        } else {
            out.put(t.as_bytes());
        }
        return;
    }
    match tok.text.parse::<f64>() {
        Ok(v) => write_f64(out, v),
        // The lexer only produces strict JSON numbers, which Rust parses.
        Err(_) => out.put(tok.text.as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern crate std;
    use std::string::String;

    fn repr(v: f64) -> String {
        let mut buf = [0u8; 64];
        let mut s = Sink::new(&mut buf);
        write_f64(&mut s, v);
        let n = s.finish().unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    /// Every length from 1 to 20 digits, and each side of every power of
    /// ten, prints as `u64`'s `Display` does.
    #[test]
    fn integers_print_as_display() {
        use std::string::ToString;
        let mut cases = std::vec![0, 1, 9, u64::MAX, u64::MAX - 1, 140_245_832_663_040];
        let mut p = 1u64;
        while let Some(next) = p.checked_mul(10) {
            cases.extend([p - 1, p, p + 1, next / 3]);
            p = next;
        }
        cases.extend([p - 1, p, p + 1]);
        for v in cases {
            let mut buf = [0u8; 32];
            let mut s = Sink::new(&mut buf);
            write_u64(&mut s, v);
            let n = s.finish().unwrap();
            assert_eq!(&buf[..n], v.to_string().as_bytes(), "{v}");
        }
    }

    #[test]
    fn float_repr_matches_python() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (1e-5, "1e-05"),
            (1e-4, "0.0001"),
            (0.1, "0.1"),
            (1.5, "1.5"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e300, "1e+300"),
            (-2.5e-300, "-2.5e-300"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (123456789.125, "123456789.125"),
            // Two 17-digit strings round-trip; Python takes the one the
            // exact value rounds to (ties to even).
            (1059438285926254.0 + 0.25, "1059438285926254.2"),
            (1839832758546370.0 + 0.25, "1839832758546370.2"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for &(v, want) in cases {
            assert_eq!(repr(v), want, "repr({v:?})");
        }
    }

    #[test]
    fn u64_write_every_length() {
        let mut v: u64 = 0;
        for len in 1..=20 {
            v = v * 10 + (len % 10);
            for x in [v, v.saturating_sub(1), 10u64.saturating_pow(len as u32 - 1)] {
                let mut buf = [0u8; 20];
                let mut s = Sink::new(&mut buf);
                write_u64(&mut s, x);
                let n = s.finish().unwrap();
                assert_eq!(
                    core::str::from_utf8(&buf[..n]).unwrap(),
                    std::format!("{x}")
                );
            }
        }
        let mut buf = [0u8; 20];
        let mut s = Sink::new(&mut buf);
        write_u64(&mut s, u64::MAX);
        let n = s.finish().unwrap();
        assert_eq!(&buf[..n], b"18446744073709551615");
    }

    #[test]
    fn u64_parse_every_length() {
        let mut v: u64 = 0;
        for len in 1..=20 {
            v = v * 10 + (len % 10);
            let text = std::format!("{v}");
            let tok = NumberToken {
                text: &text,
                is_integer: true,
            };
            assert_eq!(parse_u64(tok), Ok(v), "{text}");
        }
        for text in ["0", "7", "12345678", "123456789", "9999999999999999999"] {
            let tok = NumberToken {
                text,
                is_integer: true,
            };
            assert_eq!(parse_u64(tok), Ok(text.parse().unwrap()));
        }
    }

    #[test]
    fn u64_parse_limits() {
        let tok = |t: &'static str, is_integer| NumberToken {
            text: t,
            is_integer,
        };
        assert_eq!(parse_u64(tok("18446744073709551615", true)), Ok(u64::MAX));
        assert_eq!(
            parse_u64(tok("18446744073709551616", true)),
            Err(U64Error::TooLarge)
        );
        assert_eq!(parse_u64(tok("-1", true)), Err(U64Error::Negative));
        assert_eq!(parse_u64(tok("-0", true)), Ok(0));
        assert_eq!(
            parse_u64(tok("-99999999999999999999999", true)),
            Err(U64Error::Negative)
        );
        assert_eq!(parse_u64(tok("1.0", false)), Err(U64Error::NotAnInteger));
    }
}
