//! [`Uid`]: a Kubernetes `metadata.uid`, kept as 16 bytes when it is a UUID.

use std::fmt;

use compact_str::CompactString;

/// A Kubernetes `metadata.uid`, borrowed from a pod or a resource: the 16 bytes of a UUID
/// written as the API server writes them (lowercase, `8-4-4-4-12`), or any other text as is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Uid<'a> {
    Uuid([u8; 16]),
    Text(&'a str),
}

impl<'a> Uid<'a> {
    /// Reads `text` as a UUID when it is one in the API server's form (so it formats back to
    /// the same text); anything else is text.
    pub(crate) fn parse(text: &'a str) -> Self {
        match uuid::Uuid::try_parse(text) {
            Ok(uuid)
                if uuid
                    .hyphenated()
                    .encode_lower(&mut uuid::Uuid::encode_buffer())
                    == text =>
            {
                Uid::Uuid(uuid.into_bytes())
            }
            _ => Uid::Text(text),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        *self == Uid::Text("")
    }

    /// Whether this is the uid written `text`.
    pub(crate) fn is(&self, text: &str) -> bool {
        *self == Uid::parse(text)
    }
}

impl fmt::Display for Uid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Text(text) => f.write_str(text),
            Uid::Uuid(bytes) => fmt::Display::fmt(&uuid::Uuid::from_bytes(*bytes).hyphenated(), f),
        }
    }
}

/// An owned [`Uid`]: a UUID's bytes, or other text (inline up to 24 bytes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum UidBuf {
    Uuid([u8; 16]),
    Text(CompactString),
}

impl Default for UidBuf {
    fn default() -> Self {
        UidBuf::Text(CompactString::default())
    }
}

impl UidBuf {
    pub(crate) fn as_uid(&self) -> Uid<'_> {
        match self {
            UidBuf::Uuid(bytes) => Uid::Uuid(*bytes),
            UidBuf::Text(text) => Uid::Text(text),
        }
    }
}

impl From<Uid<'_>> for UidBuf {
    fn from(uid: Uid<'_>) -> Self {
        match uid {
            Uid::Uuid(bytes) => UidBuf::Uuid(bytes),
            Uid::Text(text) => UidBuf::Text(text.into()),
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
