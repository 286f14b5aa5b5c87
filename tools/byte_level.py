"""GPT-2's byte-level alphabet: the map from each byte to the printable
character that byte-level BPE vocabularies (tokenizer.json "ByteLevel") spell
it with. Shared by the scripts that write tiny tokenizers."""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
