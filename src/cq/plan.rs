//! Which bit width and group each CQ matrix of an archive gets, by its class
//! (`cqlm synth` and `cqlm pack` share these plans).

/// Bits per class of CQ matrix (SPEC §3 names) and the preferred group width: what
/// `cqlm synth` draws and `cqlm pack` quantizes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitsPlan {
    /// `embed`.
    pub embed: u32,
    /// `wq`, `wg`.
    pub attn_qg: u32,
    /// `wk`, `wv`.
    pub attn_kv: u32,
    /// `wo`.
    pub attn_o: u32,
    /// `mhc.phi_*`.
    pub phi: u32,
    /// `engram.table.*`.
    pub engram_table: u32,
    /// `engram.*.wk`, `engram.*.wv`.
    pub engram_proj: u32,
    /// Preferred group; a matrix with fewer columns uses the smallest power of two
    /// `>= max(32, cols)` instead.
    pub group: usize,
}

impl BitsPlan {
    /// The plan of the `default` preset: embed 4, attention 2, Φ 4, engram 4, group 128.
    pub fn standard() -> BitsPlan {
        BitsPlan {
            embed: 4,
            attn_qg: 2,
            attn_kv: 2,
            attn_o: 2,
            phi: 4,
            engram_table: 4,
            engram_proj: 4,
            group: 128,
        }
    }

    /// The plan of the `tiny` preset: every bit width appears, group 32.
    pub fn mixed() -> BitsPlan {
        BitsPlan {
            embed: 4,
            attn_qg: 2,
            attn_kv: 8,
            attn_o: 1,
            phi: 4,
            engram_table: 8,
            engram_proj: 2,
            group: 32,
        }
    }

    /// The same bit width for every class, with preferred group `group`.
    pub fn uniform(bits: u32, group: usize) -> BitsPlan {
        BitsPlan {
            embed: bits,
            attn_qg: bits,
            attn_kv: bits,
            attn_o: bits,
            phi: bits,
            engram_table: bits,
            engram_proj: bits,
            group,
        }
    }

    /// This plan with the bit widths of `spec` applied left to right: a
    /// comma-separated list of `CLASS=BITS`, `BITS` one of 1, 2, 4, 8 and `CLASS`
    /// one of `embed`, `attn` (`wq wk wv wg wo`), `attn_qg` (`wq wg`), `attn_kv`
    /// (`wk wv`), `attn_o` (`wo`), `phi` (`mhc.phi_*`), `engram` (tables and
    /// projections), `engram_table`, `engram_proj` or `all`.
    ///
    /// # Errors
    /// A message naming the malformed item, unknown class or bit width.
    pub fn with_bits(&self, spec: &str) -> std::result::Result<BitsPlan, String> {
        let mut plan = self.clone();
        if spec.trim().is_empty() {
            return Err("the list is empty (expected CLASS=BITS,...)".into());
        }
        for item in spec.split(',') {
            let item = item.trim();
            let Some((class, bits)) = item.split_once('=') else {
                return Err(format!("`{item}` is not CLASS=BITS"));
            };
            let bits: u32 = match bits.trim().parse() {
                Ok(b @ (1 | 2 | 4 | 8)) => b,
                _ => {
                    return Err(format!(
                        "`{item}`: bits must be 1, 2, 4 or 8, not `{}`",
                        bits.trim()
                    ))
                }
            };
            let fields: Vec<&mut u32> = match class.trim() {
                "embed" => vec![&mut plan.embed],
                "attn" => vec![&mut plan.attn_qg, &mut plan.attn_kv, &mut plan.attn_o],
                "attn_qg" => vec![&mut plan.attn_qg],
                "attn_kv" => vec![&mut plan.attn_kv],
                "attn_o" => vec![&mut plan.attn_o],
                "phi" => vec![&mut plan.phi],
                "engram" => vec![&mut plan.engram_table, &mut plan.engram_proj],
                "engram_table" => vec![&mut plan.engram_table],
                "engram_proj" => vec![&mut plan.engram_proj],
                "all" => vec![
                    &mut plan.embed,
                    &mut plan.attn_qg,
                    &mut plan.attn_kv,
                    &mut plan.attn_o,
                    &mut plan.phi,
                    &mut plan.engram_table,
                    &mut plan.engram_proj,
                ],
                other => {
                    return Err(format!(
                        "unknown class `{other}` (expected embed, attn, attn_qg, attn_kv, attn_o, phi, engram, engram_table, engram_proj or all)"
                    ))
                }
            };
            for f in fields {
                *f = bits;
            }
        }
        Ok(plan)
    }

    /// Bits of the CQ matrix named `name` (SPEC §3), by its class.
    pub fn bits_for(&self, name: &str) -> u32 {
        let last = name.rsplit('.').next().unwrap_or(name);
        if name == "embed" {
            self.embed
        } else if name.starts_with("mhc.") {
            self.phi
        } else if name.starts_with("engram.table.") {
            self.engram_table
        } else if name.starts_with("engram.") {
            self.engram_proj
        } else {
            match last {
                "wq" | "wg" => self.attn_qg,
                "wk" | "wv" => self.attn_kv,
                _ => self.attn_o,
            }
        }
    }

    /// Group width used for a matrix of `cols` columns.
    pub fn group_for(&self, cols: usize) -> usize {
        self.group.min(cols.next_power_of_two()).max(32)
    }
}

/// The plan a preset name uses (`tiny` → mixed, otherwise standard).
pub fn plan_for_preset(name: &str) -> BitsPlan {
    if name == "tiny" {
        BitsPlan::mixed()
    } else {
        BitsPlan::standard()
    }
}
