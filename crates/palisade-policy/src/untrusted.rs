//! Text the sandbox controls (a DNS name it asked for, a `Host` header, a file name it created),
//! made safe to print in palisade's own output: every control character, escape sequence, bidi
//! override and invalid UTF-8 byte is shown as an escape, and the length is bounded.
//!
//! Anything palisade prints on a terminal or writes into a log line that the sandbox could have
//! shaped goes through [`Untrusted`]; otherwise a payload could forge palisade's own lines
//! (`\r\x1b[2Kpalisade: ok`), retitle the terminal, or flood the caller's stderr.

use std::fmt;

/// Most characters of untrusted text that [`Untrusted`] prints before it cuts and says how many
/// bytes it left out.
pub const MAX_SHOWN: usize = 256;

/// Displays sandbox-controlled bytes escaped and cut at `max` characters.
///
/// ```
/// use palisade_policy::untrusted::Untrusted;
/// let shown = Untrusted::new(b"a\x1b[2K\rpalisade: ok\n\xff").to_string();
/// assert_eq!(shown, "a\\x1b[2K\\rpalisade: ok\\n\\xff");
/// assert!(!shown.contains('\x1b'));
/// ```
#[derive(Clone, Copy)]
pub struct Untrusted<'a> {
    bytes: &'a [u8],
    max: usize,
}

impl<'a> Untrusted<'a> {
    /// Wraps `bytes`, cut at [`MAX_SHOWN`] characters.
    pub fn new(bytes: &'a (impl AsRef<[u8]> + ?Sized)) -> Untrusted<'a> {
        Untrusted {
            bytes: bytes.as_ref(),
            max: MAX_SHOWN,
        }
    }

    /// The same text cut at `max` characters instead.
    pub fn max(self, max: usize) -> Untrusted<'a> {
        Untrusted { max, ..self }
    }
}

/// Whether `c` is printed as it is: printable, and not one of the characters that reorder or hide
/// text on a terminal (bidi controls, zero-width characters, the BOM).
fn shown_as_is(c: char) -> bool {
    !c.is_control()
        && !matches!(c,
            '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = 0usize;
        let mut pos = 0usize;
        let all = self.bytes;
        while pos < all.len() {
            let rest = &all[pos..];
            // The longest valid UTF-8 prefix, then (if any) the invalid bytes after it.
            let (valid, bad) = match std::str::from_utf8(rest) {
                Ok(s) => (s, 0),
                Err(e) => (
                    std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or_default(),
                    e.error_len().unwrap_or(rest.len() - e.valid_up_to()),
                ),
            };
            for (i, c) in valid.char_indices() {
                if shown >= self.max {
                    return write!(f, "…({} bytes more)", all.len() - pos - i);
                }
                match c {
                    '\n' => f.write_str("\\n")?,
                    '\r' => f.write_str("\\r")?,
                    '\t' => f.write_str("\\t")?,
                    '\\' => f.write_str("\\\\")?,
                    c if (c as u32) < 0x80 && !shown_as_is(c) => write!(f, "\\x{:02x}", c as u32)?,
                    c if !shown_as_is(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                    c => write!(f, "{c}")?,
                }
                shown += 1;
            }
            pos += valid.len();
            for &b in &all[pos..pos + bad] {
                if shown >= self.max {
                    return write!(f, "…({} bytes more)", all.len() - pos);
                }
                write!(f, "\\x{b:02x}")?;
                shown += 1;
                pos += 1;
            }
        }
        Ok(())
    }
}

/// [`Untrusted`] as an owned string: `text` escaped and cut at `max` characters.
pub fn escape(text: impl AsRef<[u8]>, max: usize) -> String {
    Untrusted::new(text.as_ref()).max(max).to_string()
}

impl fmt::Debug for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_bad_bytes_are_escaped() {
        assert_eq!(escape(b"plain.example", 64), "plain.example");
        assert_eq!(
            escape(b"\x1b]0;title\x07x\r\n\t\\", 64),
            "\\x1b]0;title\\x07x\\r\\n\\t\\\\"
        );
        assert_eq!(escape(b"\xc2\xb7 ok \xff\xfe", 64), "\u{b7} ok \\xff\\xfe");
        assert_eq!(
            escape("a\u{202e}b\u{200b}c\u{7f}", 64),
            "a\\u{202e}b\\u{200b}c\\x7f"
        );
        assert_eq!(escape("\u{85}", 64), "\\u{85}");
    }

    #[test]
    fn long_text_is_cut_and_the_rest_counted() {
        assert_eq!(escape(b"abcdef", 4), "abcd…(2 bytes more)");
        assert_eq!(escape(b"ab\xff\xffcd", 3), "ab\\xff…(3 bytes more)");
        assert_eq!(escape("ab\u{e9}\u{e9}", 3), "ab\u{e9}…(2 bytes more)");
        assert_eq!(escape(b"abcd", 4), "abcd");
        let huge = vec![b'\x1b'; 1 << 20];
        let s = escape(&huge, 256);
        assert!(s.len() < 256 * 4 + 32, "{}", s.len());
        assert!(
            s.ends_with(&format!("…({} bytes more)", (1 << 20) - 256)),
            "{s}"
        );
    }

    #[test]
    fn nothing_printed_is_a_control_character() {
        let all: Vec<u8> = (0..=255u8).collect();
        let s = escape(&all, 10_000);
        assert!(!s.chars().any(|c| c.is_control()), "{s}");
    }
}
