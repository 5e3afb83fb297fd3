//! G.711 μ-law: the 8-bit telephone codec Twilio media streams carry (8 kHz,
//! mono). Standard G.711 for every 16-bit sample (the Sun `g711.c` convention:
//! 14-bit magnitude, bias 33, eight segments), so `0 → 0xFF`, `32767 → 0x80`,
//! `-32768 → 0x00`; decoding is a 256-entry table.

/// The bias added to the 14-bit magnitude before the segment is found.
const BIAS: i32 = 0x21;
/// The largest 14-bit magnitude (before the bias).
const CLIP: i32 = 8159;

/// Every μ-law byte's 16-bit sample, built at compile time.
static DECODE: [i16; 256] = decode_table();

const fn decode_table() -> [i16; 256] {
    let mut table = [0i16; 256];
    let mut byte = 0;
    while byte < 256 {
        let inverted = !(byte as u8);
        let segment = ((inverted >> 4) & 0x07) as i32;
        let mantissa = (inverted & 0x0F) as i32;
        // ((mantissa << 3) + 0x84) << segment, minus the bias, in 16-bit units.
        let magnitude = (((mantissa << 3) + 0x84) << segment) - 0x84;
        table[byte] = if inverted & 0x80 != 0 { -magnitude as i16 } else { magnitude as i16 };
        byte += 1;
    }
    table
}

/// The 16-bit linear sample of one μ-law byte.
pub fn decode(byte: u8) -> i16 {
    DECODE[usize::from(byte)]
}

/// The μ-law byte of one 16-bit linear sample.
pub fn encode(sample: i16) -> u8 {
    // 14-bit magnitude, as G.711 defines its input; the mask also inverts the bits.
    let mut value = i32::from(sample) >> 2;
    let mask: u8 = if value < 0 {
        value = -value;
        0x7F
    } else {
        0xFF
    };
    let value = value.min(CLIP) + BIAS;
    let segment = segment_of(value);
    if segment >= 8 {
        return 0x7F ^ mask;
    }
    let mantissa = ((value >> (segment + 1)) & 0x0F) as u8;
    ((segment as u8) << 4 | mantissa) ^ mask
}

/// The segment of a biased 14-bit magnitude: 0 up to 0x3F, then one per
/// doubling (8 means past the last).
fn segment_of(biased: i32) -> u32 {
    (31 - (biased as u32).leading_zeros()).saturating_sub(5)
}

/// Decodes a buffer of μ-law bytes to 16-bit samples.
pub fn decode_all(bytes: &[u8]) -> Vec<i16> {
    bytes.iter().map(|&b| decode(b)).collect()
}

/// Encodes 16-bit little-endian PCM to μ-law, one byte per sample; a trailing
/// odd byte is dropped.
pub fn encode_pcm16le(pcm: &[u8]) -> Vec<u8> {
    pcm.chunks_exact(2).map(|pair| encode(i16::from_le_bytes([pair[0], pair[1]]))).collect()
}

/// The quantisation step of the μ-law segment `sample` falls in, in 16-bit
/// units: how far `decode(encode(sample))` may be from `sample`.
pub fn step(sample: i16) -> i32 {
    let magnitude = (i32::from(sample) >> 2).abs().min(CLIP) + BIAS;
    let segment = segment_of(magnitude).min(7);
    // A mantissa step is 2^(segment+1) in 14-bit units, 4× that in 16-bit units.
    1 << (segment + 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference vectors (CPython 3.11 `audioop`, the Sun g711.c convention).
    #[test]
    fn decode_matches_the_reference_vectors() {
        let vectors: [(u8, i16); 7] = [
            (0x00, -32124),
            (0x01, -31100),
            (0x7E, -8),
            (0x7F, 0),
            (0x80, 32124),
            (0xFE, 8),
            (0xFF, 0),
        ];
        for (byte, sample) in vectors {
            assert_eq!(decode(byte), sample, "decode({byte:#04x})");
        }
    }

    #[test]
    fn encode_matches_the_reference_vectors() {
        let vectors: [(i16, u8); 11] = [
            (0, 0xFF),
            (1, 0xFF),
            (-1, 0x7E),
            (8, 0xFE),
            (-8, 0x7E),
            (100, 0xF2),
            (-100, 0x72),
            (1000, 0xCE),
            (-1000, 0x4E),
            (32767, 0x80),
            (-32768, 0x00),
        ];
        for (sample, byte) in vectors {
            assert_eq!(encode(sample), byte, "encode({sample})");
        }
    }

    /// Every byte decodes to a sample that encodes back to the same byte, except
    /// the two zeros (0x7F, "negative zero", encodes as 0xFF).
    #[test]
    fn every_byte_survives_decode_then_encode() {
        for byte in 0..=255u8 {
            let expected = if byte == 0x7F { 0xFF } else { byte };
            assert_eq!(encode(decode(byte)), expected, "byte {byte:#04x}");
        }
    }

    /// Over all 65536 samples: the code is the nearest level of its segment
    /// (within one step), magnitude is monotonic and the sign is kept.
    #[test]
    fn every_sample_encodes_within_its_quantisation_step_and_monotonically() {
        let mut previous = encode(i16::MIN);
        for sample in i16::MIN..=i16::MAX {
            let byte = encode(sample);
            let back = i32::from(decode(byte));
            let error = (back - i32::from(sample)).abs();
            assert!(error <= step(sample), "sample {sample}: {back} is {error} away");
            // Decoded levels never go down as the input goes up.
            assert!(i32::from(decode(byte)) >= i32::from(decode(previous)), "sample {sample}");
            if sample > 8 {
                assert_eq!(byte & 0x80, 0x80, "positive {sample}");
            } else if sample < -8 {
                assert_eq!(byte & 0x80, 0, "negative {sample}");
            }
            previous = byte;
        }
    }

    /// Loud samples stay loud: the reference implementation's encoder mapped
    /// 16384 to silence.
    #[test]
    fn loud_samples_are_not_silenced() {
        assert_eq!(encode(16384), 0x8F);
        assert!(decode(encode(16384)) > 15_000);
        assert!(decode(encode(-16384)) < -15_000);
    }

    #[test]
    fn pcm_buffers_encode_per_sample_and_drop_an_odd_byte() {
        let pcm = [0x00, 0x00, 0xFF, 0x7F, 0x00, 0x80, 0x12];
        assert_eq!(encode_pcm16le(&pcm), vec![0xFF, 0x80, 0x00]);
        assert_eq!(decode_all(&[0xFF, 0x80]), vec![0, 32124]);
        assert!(encode_pcm16le(&[]).is_empty());
    }

    proptest! {
        #[test]
        fn decode_of_encode_is_within_the_quantisation_step(sample in any::<i16>()) {
            let back = i32::from(decode(encode(sample)));
            prop_assert!((back - i32::from(sample)).abs() <= step(sample));
        }
    }
}
