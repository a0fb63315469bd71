//! [`Uid`]: a Kubernetes `metadata.uid`, kept as 16 bytes when it is a UUID.

use std::fmt;

/// A Kubernetes `metadata.uid`, borrowed from a [`crate::discovery::model::pod::Pod`] or a resource: the 16 bytes of a UUID
/// written as the API server writes them (lowercase, `8-4-4-4-12`), or any other text as is.
/// Stored as bytes, a uid takes 16 B in the pod's table instead of a 56-byte `Arc<str>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Uid<'a> {
    Uuid([u8; 16]),
    Text(&'a str),
}

impl<'a> Uid<'a> {
    /// Reads `text` as a canonical UUID when it is one (so it formats back to the same text).
    pub fn parse(text: &'a str) -> Self {
        let b = text.as_bytes();
        let dashes = [8, 13, 18, 23];
        if b.len() != 36 || dashes.iter().any(|&i| b[i] != b'-') {
            return Uid::Text(text);
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut nibbles = b
            .iter()
            .enumerate()
            .filter(|(i, _)| !dashes.contains(i))
            .map(|(_, c)| digit(*c));
        let mut bytes = [0u8; 16];
        for byte in &mut bytes {
            match (nibbles.next().flatten(), nibbles.next().flatten()) {
                (Some(high), Some(low)) => *byte = high << 4 | low,
                _ => return Uid::Text(text),
            }
        }
        Uid::Uuid(bytes)
    }

    pub fn is_empty(&self) -> bool {
        *self == Uid::Text("")
    }

    /// Whether this is the uid written `text`.
    pub fn is(&self, text: &str) -> bool {
        *self == Uid::parse(text)
    }
}

impl fmt::Display for Uid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Text(text) => f.write_str(text),
            Uid::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_sixteen_bytes_that_format_back_to_their_text() {
        let text = "6f1c1d8e-0a1b-4c2d-8e3f-00000000abcd";
        let uid = Uid::parse(text);
        assert!(matches!(uid, Uid::Uuid(_)));
        assert_eq!(uid.to_string(), text);
        assert!(uid.is(text) && !uid.is("6f1c1d8e-0a1b-4c2d-8e3f-00000000abce"));
        // Anything else stays text, so it too reads back exactly.
        for other in [
            "",
            "uid-1",
            "6F1C1D8E-0A1B-4C2D-8E3F-00000000ABCD",
            "6f1c1d8e-0a1b-4c2d-8e3f-00000000abc",
            "6f1c1d8e+0a1b-4c2d-8e3f-00000000abcd",
            "6f1c1d8e-0a1b-4c2d-8e3f-00000000abcg",
        ] {
            assert_eq!(Uid::parse(other), Uid::Text(other));
        }
    }
}
