//! The frame codec's building blocks: decode errors, byte strings, bounded
//! sequences and the canonical encoding of signed bodies.

use serde::{Deserialize, Serialize};

use super::{MAX_BATCH_ROLLOUTS, Tag};

/// Errors from decoding frames. Every one means the peer sent bad bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Not enough bytes yet: at least `needed` in total are required.
    #[error("incomplete frame: need {needed} bytes")]
    Incomplete {
        /// Total bytes needed to make progress.
        needed: usize,
    },
    /// The tag number is not one this version knows.
    #[error("unknown frame tag {0}")]
    UnknownTag(u16),
    /// The body is larger than its tag allows.
    #[error("frame {tag:?} body of {len} bytes exceeds its limit of {max}")]
    Oversized {
        /// The frame's tag.
        tag: Tag,
        /// Declared body length.
        len: u32,
        /// The tag's limit.
        max: u32,
    },
    /// The body is not a valid postcard encoding of the tag's type.
    #[error("malformed {tag:?} body: {reason}")]
    Malformed {
        /// The frame's tag.
        tag: Tag,
        /// What postcard said.
        reason: String,
    },
    /// The body decoded but bytes were left over.
    #[error("{tag:?} body has {extra} trailing bytes")]
    TrailingBytes {
        /// The frame's tag.
        tag: Tag,
        /// Bytes left over.
        extra: usize,
    },
}

/// An owned byte string that postcard encodes as length ‖ bytes (not as a
/// sequence of integers).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Blob(pub Vec<u8>);

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Blob;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

/// A sequence of at most [`MAX_BATCH_ROLLOUTS`] elements: a longer one is an
/// error before it is allocated.
pub(super) fn bounded_vec<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    struct Bounded<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {MAX_BATCH_ROLLOUTS} elements")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let hint = seq.size_hint().unwrap_or(0);
            if hint > MAX_BATCH_ROLLOUTS {
                return Err(serde::de::Error::invalid_length(hint, &self));
            }
            let mut out = Vec::with_capacity(hint);
            while let Some(x) = seq.next_element()? {
                if out.len() == MAX_BATCH_ROLLOUTS {
                    return Err(serde::de::Error::invalid_length(out.len() + 1, &self));
                }
                out.push(x);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded(std::marker::PhantomData))
}

/// The postcard encoding used as the canonical bytes of signed bodies.
pub fn canonical<T: Serialize>(body: &T) -> Vec<u8> {
    // Serializing plain in-memory structs to a Vec cannot fail.
    postcard::to_stdvec(body).unwrap_or_default()
}
