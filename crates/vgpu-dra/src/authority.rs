//! The kubelet's HTTP/2 connections to the driver's sockets, made acceptable
//! to h2. The kubelet's plugin manager dials the registration socket with
//! the bare path as grpc-go's target and no `WithAuthority`, so every
//! request carries `:authority` = the percent-escaped path
//! (`%2Fvar%2Flib%2Fkubelet%2F…-reg.sock`); h2 refuses that with a stream
//! reset (PROTOCOL_ERROR, hyperium/h2#487) and the driver is never
//! registered. [`LocalAuthority`] wraps an accepted connection and rewrites
//! what the client sends: each header block is decoded and encoded anew
//! (HPACK keeps per-direction state, so every block goes through the one
//! decoder) with an `:authority` that is not a valid authority replaced by
//! `localhost`. Every other frame, and the server's direction, passes
//! byte for byte. It never answers the client itself: a connection it
//! cannot follow is closed with an error.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use httlib_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client's connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Frames we write: the least SETTINGS_MAX_FRAME_SIZE a server may set.
const OUT_FRAME: usize = 16_384;
/// A header block larger than this, or one that decodes to a larger
/// header list (RFC 9113 size: name + value + 32 per field), closes the
/// connection: 4 times the 16 KiB list hyper's server accepts at all (the
/// kubelet's are a few hundred bytes), and a bound on what a block of
/// one-byte references to a large table entry can make us hold.
pub const MAX_BLOCK: usize = 64 << 10;
/// The most dynamic table a client may size its encoder to (RFC 7541
/// starts every table at 4096).
const MAX_TABLE: u32 = 64 << 10;
/// What a socket-path authority becomes.
pub const LOCALHOST: &[u8] = b"localhost";

/// Why a client's byte stream could not be followed.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// Not an HTTP/2 connection.
    #[error("the client did not open with the HTTP/2 connection preface")]
    Preface,
    /// A frame HTTP/2 does not allow there.
    #[error("HTTP/2 frame on stream {stream}: {what}")]
    Frame {
        /// Stream id.
        stream: u32,
        /// What is wrong.
        what: &'static str,
    },
    /// A header block, or its header list, past [`MAX_BLOCK`].
    #[error("a header block or list of more than {MAX_BLOCK} bytes on stream {0}")]
    TooLarge(u32),
    /// HPACK that does not decode.
    #[error("HPACK header block on stream {stream}: {source}")]
    Hpack {
        /// Stream id.
        stream: u32,
        /// Cause.
        #[source]
        source: httlib_hpack::DecoderError,
    },
    /// A field the encoder refused.
    #[error("re-encoding a header block on stream {stream}: {source}")]
    Encode {
        /// Stream id.
        stream: u32,
        /// Cause.
        #[source]
        source: httlib_hpack::EncoderError,
    },
}

/// Where the reader is in the client's stream.
#[derive(Clone, Copy, Debug)]
enum State {
    /// This many bytes of the preface seen.
    Preface(usize),
    /// Collecting a 9-byte frame header.
    Head,
    /// Copying this many more payload bytes through.
    Pass(usize),
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    Payload {
        kind: u8,
        flags: u8,
        stream: u32,
        len: usize,
    },
}

/// A header block waiting for its CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server rewriting, without I/O: bytes in, bytes out.
pub struct Rewriter {
    state: State,
    head: [u8; 9],
    head_len: usize,
    payload: Vec<u8>,
    block: Option<Block>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::default();
        decoder.set_max_dynamic_size(MAX_TABLE);
        Rewriter {
            state: State::Preface(0),
            head: [0; 9],
            head_len: 0,
            payload: Vec::new(),
            block: None,
            decoder,
            // Never indexes (no WITH_INDEXING flag): nothing of ours in the
            // server's dynamic table to keep in step with.
            encoder: Encoder::default(),
        }
    }
}

impl Rewriter {
    /// Takes the next bytes from the client; appends what goes to the
    /// server to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        while !input.is_empty() {
            match self.state {
                State::Preface(seen) => {
                    let n = (PREFACE.len() - seen).min(input.len());
                    if input[..n] != PREFACE[seen..seen + n] {
                        return Err(AuthorityError::Preface);
                    }
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if seen + n == PREFACE.len() {
                        State::Head
                    } else {
                        State::Preface(seen + n)
                    };
                }
                State::Head => {
                    let n = (9 - self.head_len).min(input.len());
                    self.head[self.head_len..self.head_len + n].copy_from_slice(&input[..n]);
                    self.head_len += n;
                    input = &input[n..];
                    if self.head_len == 9 {
                        self.head_len = 0;
                        self.frame_head(out)?;
                    }
                }
                State::Pass(left) => {
                    let n = left.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if n == left {
                        State::Head
                    } else {
                        State::Pass(left - n)
                    };
                }
                State::Payload {
                    kind,
                    flags,
                    stream,
                    len,
                } => {
                    let n = (len - self.payload.len()).min(input.len());
                    self.payload.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.payload.len() == len {
                        self.state = State::Head;
                        self.header_frame(kind, flags, stream, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn frame_head(&mut self, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        let h = self.head;
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let in_block = self.block.as_ref().map(|b| b.stream);
        let ours = match in_block {
            // RFC 9113 §6.10: nothing but this stream's CONTINUATION until
            // the block ends.
            Some(s) if kind != CONTINUATION || stream != s => {
                return Err(AuthorityError::Frame {
                    stream,
                    what: "a header block interrupted before END_HEADERS",
                })
            }
            Some(_) => true,
            // A stray CONTINUATION goes through for h2 to refuse.
            None => kind == HEADERS,
        };
        if !ours {
            out.extend_from_slice(&h);
            self.state = if len == 0 {
                State::Head
            } else {
                State::Pass(len)
            };
            return Ok(());
        }
        let held = self.block.as_ref().map_or(0, |b| b.fragment.len());
        if held + len > MAX_BLOCK {
            return Err(AuthorityError::TooLarge(stream));
        }
        self.payload.clear();
        if len == 0 {
            return self.header_frame(kind, flags, stream, out);
        }
        self.state = State::Payload {
            kind,
            flags,
            stream,
            len,
        };
        Ok(())
    }

    /// A whole HEADERS or CONTINUATION payload is in `self.payload`.
    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityError> {
        let bad = |what| AuthorityError::Frame { stream, what };
        if kind == HEADERS {
            let mut p = self.payload.as_slice();
            let mut pad = 0;
            if flags & PADDED != 0 {
                let (&n, rest) = p.split_first().ok_or(bad("PADDED without a pad length"))?;
                pad = usize::from(n);
                p = rest;
            }
            let mut priority = None;
            if flags & PRIORITY != 0 {
                let (pr, rest) = p
                    .split_first_chunk::<5>()
                    .ok_or(bad("PRIORITY without its 5 bytes"))?;
                priority = Some(*pr);
                p = rest;
            }
            let end = p
                .len()
                .checked_sub(pad)
                .ok_or(bad("padding longer than the frame"))?;
            let fragment = p[..end].to_vec();
            self.block = Some(Block {
                stream,
                end_stream: flags & END_STREAM != 0,
                priority,
                fragment,
            });
        } else if let Some(b) = &mut self.block {
            b.fragment.extend_from_slice(&self.payload);
        }
        if flags & END_HEADERS != 0 {
            if let Some(b) = self.block.take() {
                self.emit(b, out)?;
            }
        }
        Ok(())
    }

    /// Decodes a whole block, fixes `:authority`, writes it as HEADERS
    /// (+ CONTINUATION) frames.
    fn emit(&mut self, b: Block, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        let stream = b.stream;
        let mut buf = b.fragment;
        let mut fields = Vec::new();
        let mut list = 0;
        // A few fields at a time, so the list is bounded while it grows.
        while !buf.is_empty() {
            let mut batch = Vec::with_capacity(16);
            self.decoder
                .decode_exact(&mut buf, &mut batch)
                .map_err(|source| AuthorityError::Hpack { stream, source })?;
            list += batch
                .iter()
                .map(|f| f.0.len() + f.1.len() + 32)
                .sum::<usize>();
            if list > MAX_BLOCK {
                return Err(AuthorityError::TooLarge(stream));
            }
            fields.append(&mut batch);
        }
        let mut block = Vec::new();
        for (name, mut value, flags) in fields {
            if name == b":authority" && !valid_authority(&value) {
                value = LOCALHOST.to_vec();
            }
            // Static-table indexes where they fit; a never-indexed field
            // stays never indexed.
            let flags = Encoder::BEST_FORMAT | (flags & Encoder::NEVER_INDEXED);
            self.encoder
                .encode((name, value, flags), &mut block)
                .map_err(|source| AuthorityError::Encode { stream, source })?;
        }
        let prio = b.priority.map_or(0, |_| 5);
        let mut rest = block.as_slice();
        let mut first = true;
        loop {
            let room = OUT_FRAME - if first { prio } else { 0 };
            let (chunk, tail) = rest.split_at(rest.len().min(room));
            rest = tail;
            let mut flags = if rest.is_empty() { END_HEADERS } else { 0 };
            let kind = if first {
                flags |= if b.end_stream { END_STREAM } else { 0 };
                flags |= if b.priority.is_some() { PRIORITY } else { 0 };
                HEADERS
            } else {
                CONTINUATION
            };
            let len = chunk.len() + if first { prio } else { 0 };
            out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
            out.extend_from_slice(&[kind, flags]);
            out.extend_from_slice(&stream.to_be_bytes());
            if first {
                out.extend_from_slice(b.priority.as_ref().map_or(&[][..], |p| &p[..]));
            }
            out.extend_from_slice(chunk);
            first = false;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }
}

/// Whether h2 accepts `v` as `:authority`.
pub fn valid_authority(v: &[u8]) -> bool {
    http::uri::Authority::try_from(v).is_ok()
}

/// A server-side connection whose client's `:authority` h2 will accept.
pub struct LocalAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    out: Vec<u8>,
    sent: usize,
    scratch: Box<[u8]>,
}

impl<S> LocalAuthority<S> {
    /// Wraps an accepted connection.
    pub fn new(inner: S) -> Self {
        LocalAuthority {
            inner,
            rewriter: Rewriter::default(),
            out: Vec::new(),
            sent: 0,
            scratch: vec![0; 16 << 10].into_boxed_slice(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LocalAuthority<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.sent < this.out.len() {
                let n = (this.out.len() - this.sent).min(buf.remaining());
                buf.put_slice(&this.out[this.sent..this.sent + n]);
                this.sent += n;
                if this.sent == this.out.len() {
                    this.out.clear();
                    this.sent = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            if let Err(e) = this.rewriter.feed(rb.filled(), &mut this.out) {
                tracing::warn!("closing a kubelet connection: {e}");
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LocalAuthority<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for LocalAuthority<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Field = (Vec<u8>, Vec<u8>, u8);

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// (kind, flags, stream, payload) of each frame after the preface.
    fn frames(mut b: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]);
            v.push((b[3], b[4], stream, b[9..9 + len].to_vec()));
            b = &b[9 + len..];
        }
        v
    }

    /// What grpc-go sends for a unary call, `:authority` as given.
    fn grpc_go_fields(authority: &str) -> Vec<(&'static str, String)> {
        vec![
            (":method", "POST".into()),
            (":scheme", "http".into()),
            (":path", "/pluginregistration.Registration/GetInfo".into()),
            (":authority", authority.into()),
            ("content-type", "application/grpc".into()),
            ("user-agent", "grpc-go/1.72.2".into()),
            ("te", "trailers".into()),
            ("grpc-timeout", "999924u".into()),
        ]
    }

    /// Encodes as grpc-go's hpack does: indexed when it can, Huffman.
    fn encode(enc: &mut Encoder<'_>, fields: &[(&str, String)], flags: u8) -> Vec<u8> {
        let mut b = Vec::new();
        for (n, v) in fields {
            enc.encode(
                (n.as_bytes().to_vec(), v.as_bytes().to_vec(), flags),
                &mut b,
            )
            .unwrap();
        }
        b
    }

    fn decode(dec: &mut Decoder<'_>, block: &[u8]) -> Vec<Field> {
        let mut buf = block.to_vec();
        let mut f = Vec::new();
        dec.decode(&mut buf, &mut f).unwrap();
        f
    }

    fn rewrite_all(input: &[u8]) -> Result<Vec<u8>, AuthorityError> {
        let mut out = Vec::new();
        Rewriter::default().feed(input, &mut out)?;
        Ok(out)
    }

    const SOCK: &str = "%2Ftmp%2Fx.sock";
    const GO: u8 = Encoder::HUFFMAN_NAME
        | Encoder::HUFFMAN_VALUE
        | Encoder::WITH_INDEXING
        | Encoder::BEST_FORMAT;

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_rest_passes() {
        let mut enc = Encoder::default();
        let fields = grpc_go_fields(SOCK);
        let b1 = encode(&mut enc, &fields, GO);
        // The second request finds `:authority` in the dynamic table.
        let b2 = encode(&mut enc, &fields, GO);
        assert!(b2.len() < 12, "second block indexed: {b2:?}");
        let mut input = PREFACE.to_vec();
        let settings = frame(4, 0, 0, &[0, 2, 0, 0, 0, 0]);
        let window = frame(8, 0, 0, &[0, 0, 0xff, 0xff]);
        input.extend(&settings);
        input.extend(&window);
        // Padded, with a priority.
        let mut p1 = vec![3];
        p1.extend([0x80, 0, 0, 0, 15]);
        p1.extend(&b1);
        p1.extend([0, 0, 0]);
        input.extend(frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 1, &p1));
        let data = frame(0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
        input.extend(&data);
        // Split over a CONTINUATION.
        let (a, b) = b2.split_at(2);
        input.extend(frame(HEADERS, 0, 3, a));
        input.extend(frame(CONTINUATION, END_HEADERS, 3, b));
        let data3 = frame(0, END_STREAM, 3, &[0, 0, 0, 0, 0]);
        input.extend(&data3);
        let ping = frame(6, 0, 0, &[1; 8]);
        input.extend(&ping);

        let whole = rewrite_all(&input).unwrap();
        // Byte by byte gives the same.
        let mut r = Rewriter::default();
        let mut bytewise = Vec::new();
        for b in &input {
            r.feed(std::slice::from_ref(b), &mut bytewise).unwrap();
        }
        assert_eq!(whole, bytewise);

        assert_eq!(&whole[..24], PREFACE);
        let out = frames(&whole[24..]);
        assert_eq!(out.len(), 7, "{out:?}");
        let raw = |f: &(u8, u8, u32, Vec<u8>)| frame(f.0, f.1, f.2, &f.3);
        assert_eq!(raw(&out[0]), settings);
        assert_eq!(raw(&out[1]), window);
        assert_eq!(raw(&out[3]), data);
        assert_eq!(raw(&out[5]), data3);
        assert_eq!(raw(&out[6]), ping);
        let mut dec = Decoder::default();
        let want: Vec<(Vec<u8>, Vec<u8>)> = fields
            .iter()
            .map(|(n, v)| {
                let v = if *n == ":authority" { "localhost" } else { v };
                (n.as_bytes().to_vec(), v.as_bytes().to_vec())
            })
            .collect();
        let (kind, flags, stream, payload) = &out[2];
        assert_eq!(
            (*kind, *flags, *stream),
            (HEADERS, END_HEADERS | PRIORITY, 1)
        );
        assert_eq!(payload[..5], [0x80, 0, 0, 0, 15]);
        let got: Vec<_> = decode(&mut dec, &payload[5..])
            .into_iter()
            .map(|(n, v, _)| (n, v))
            .collect();
        assert_eq!(got, want);
        let (kind, flags, stream, payload) = &out[4];
        assert_eq!((*kind, *flags, *stream), (HEADERS, END_HEADERS, 3));
        let got: Vec<_> = decode(&mut dec, payload)
            .into_iter()
            .map(|(n, v, _)| (n, v))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn valid_authorities_stay_and_flags_are_kept() {
        for a in ["localhost", "vgpu.io:443", "[::1]:50051"] {
            assert!(valid_authority(a.as_bytes()), "{a}");
        }
        for a in [SOCK, "/tmp/x.sock", ""] {
            assert!(!valid_authority(a.as_bytes()), "{a}");
        }
        let mut enc = Encoder::default();
        let mut block = encode(&mut enc, &grpc_go_fields("vgpu.io:443"), 0);
        enc.encode(
            (
                b"authorization".to_vec(),
                b"secret".to_vec(),
                Encoder::NEVER_INDEXED,
            ),
            &mut block,
        )
        .unwrap();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
        let out = rewrite_all(&input).unwrap();
        let f = frames(&out[24..]);
        assert_eq!((f[0].0, f[0].1), (HEADERS, END_HEADERS | END_STREAM));
        let got = decode(&mut Decoder::default(), &f[0].3);
        assert_eq!(got[3].1, b"vgpu.io:443");
        assert_eq!(got[8].0, b"authorization");
        assert_eq!(got[8].2, Decoder::NEVER_INDEXED);
    }

    #[test]
    fn a_large_block_is_split_into_continuations() {
        let mut enc = Encoder::default();
        let mut fields = grpc_go_fields(SOCK);
        fields.push(("x-big", "v".repeat(40_000)));
        let block = encode(&mut enc, &fields, GO);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | PRIORITY, 5, &{
            let mut p = vec![0, 0, 0, 1, 7];
            p.extend(&block);
            p
        }));
        let out = rewrite_all(&input).unwrap();
        let f = frames(&out[24..]);
        assert_eq!(f.len(), 3, "40 kB in 16 kB frames");
        assert!(f.iter().all(|f| f.3.len() <= OUT_FRAME && f.2 == 5));
        assert_eq!((f[0].0, f[0].1), (HEADERS, PRIORITY));
        assert_eq!((f[1].0, f[1].1), (CONTINUATION, 0));
        assert_eq!((f[2].0, f[2].1), (CONTINUATION, END_HEADERS));
        let mut whole = f[0].3[5..].to_vec();
        whole.extend(&f[1].3);
        whole.extend(&f[2].3);
        let got = decode(&mut Decoder::default(), &whole);
        assert_eq!(got[3].1, LOCALHOST);
        assert_eq!(got[8].1.len(), 40_000);
    }

    #[test]
    fn what_cannot_be_followed_is_an_error() {
        assert!(matches!(
            rewrite_all(b"GET / HTTP/1.1\r\n\r\n"),
            Err(AuthorityError::Preface)
        ));
        let mut enc = Encoder::default();
        let block = encode(&mut enc, &grpc_go_fields(SOCK), GO);
        let with = |frames: &[Vec<u8>]| {
            let mut input = PREFACE.to_vec();
            frames.iter().for_each(|f| input.extend(f));
            rewrite_all(&input)
        };
        // A DATA frame inside a header block.
        let e = with(&[frame(HEADERS, 0, 1, &block[..3]), frame(0, 0, 1, &[0; 5])]);
        assert!(
            matches!(e, Err(AuthorityError::Frame { stream: 1, .. })),
            "{e:?}"
        );
        // Another stream's CONTINUATION.
        let e = with(&[
            frame(HEADERS, 0, 1, &block[..3]),
            frame(CONTINUATION, END_HEADERS, 3, &block[3..]),
        ]);
        assert!(
            matches!(e, Err(AuthorityError::Frame { stream: 3, .. })),
            "{e:?}"
        );
        // Padding past the payload.
        let e = with(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 1, 2])]);
        assert!(matches!(e, Err(AuthorityError::Frame { .. })), "{e:?}");
        // A block past the limit, refused before it is held.
        let e = with(&[
            frame(HEADERS, 0, 1, &vec![0; OUT_FRAME]),
            frame(CONTINUATION, 0, 1, &vec![0; MAX_BLOCK]),
        ]);
        assert!(matches!(e, Err(AuthorityError::TooLarge(1))), "{e:?}");
        // A short block of references to one large entry.
        let mut big = Vec::new();
        Encoder::default()
            .encode(
                (b"x".to_vec(), vec![b'v'; 3000], Encoder::WITH_INDEXING),
                &mut big,
            )
            .unwrap();
        big.extend([0x80 | 62; 30]);
        let e = with(&[frame(HEADERS, END_HEADERS, 1, &big)]);
        assert!(matches!(e, Err(AuthorityError::TooLarge(1))), "{e:?}");
        big.truncate(big.len() - 10);
        let ok = with(&[frame(HEADERS, END_HEADERS, 1, &big)]);
        assert!(ok.is_ok(), "{ok:?}");
        // An index no table has.
        let e = with(&[frame(HEADERS, END_HEADERS, 1, &[0xff, 0x7f])]);
        assert!(
            matches!(e, Err(AuthorityError::Hpack { stream: 1, .. })),
            "{e:?}"
        );
    }
}
