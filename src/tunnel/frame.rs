//! The tunnel's frame header: encodes and decodes kind, channel id and payload. Never touches a
//! socket or a channel's state.

use bytes::{BufMut, Bytes, BytesMut};

pub(super) const OPEN: u8 = 1;
pub(super) const OPENED: u8 = 2;
pub(super) const REFUSED: u8 = 3;
pub(super) const DATA: u8 = 4;
pub(super) const CREDIT: u8 = 5;
pub(super) const CLOSE: u8 = 6;

/// Kind and channel id.
pub(super) const HEADER: usize = 5;

/// One frame as read: the payload shares the message's buffer (no copy).
#[derive(Debug)]
pub(super) struct Frame {
    pub kind: u8,
    pub id: u32,
    pub payload: Bytes,
}

/// One frame, header and payload in one buffer (a WebSocket message is one contiguous payload).
pub(super) fn encode(kind: u8, id: u32, payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER + payload.len());
    buf.put_u8(kind);
    buf.put_u32(id);
    buf.extend_from_slice(payload);
    buf.freeze()
}

/// Splits a binary message into its frame; a message shorter than the header or naming
/// channel 0 is a protocol error (the kind is checked where it is dispatched).
pub(super) fn decode(mut message: Bytes) -> Result<Frame, String> {
    if message.len() < HEADER {
        return Err(format!("a frame of {} bytes is shorter than its {HEADER}-byte header", message.len()));
    }
    let header = message.split_to(HEADER);
    let kind = header[0];
    let id = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    if id == 0 {
        return Err(format!("a frame of kind {kind} names channel 0"));
    }
    Ok(Frame { kind, id, payload: message })
}

/// The payload of a Credit frame.
pub(super) fn credit(payload: &[u8]) -> Result<u32, String> {
    let bytes: [u8; 4] =
        payload.try_into().map_err(|_| format!("a Credit frame's payload is {} bytes, not 4", payload.len()))?;
    Ok(u32::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let frame = decode(encode(DATA, 0x0102_0304, b"hello")).unwrap();
        assert_eq!((frame.kind, frame.id, &frame.payload[..]), (DATA, 0x0102_0304, &b"hello"[..]));
        let empty = decode(encode(OPENED, 7, b"")).unwrap();
        assert_eq!((empty.kind, empty.id, empty.payload.len()), (OPENED, 7, 0));
    }

    #[test]
    fn malformed_frames_are_errors() {
        assert!(decode(Bytes::from_static(&[DATA, 0, 0, 1])).unwrap_err().contains("shorter"), "short header");
        assert!(decode(encode(DATA, 0, b"x")).unwrap_err().contains("channel 0"), "channel 0");
        assert_eq!(credit(&7u32.to_be_bytes()), Ok(7));
        assert!(credit(b"abc").unwrap_err().contains("not 4"), "credit of 3 bytes");
    }
}
