import sys, struct
# Made the seeds of fuzz/seeds-data/guest_image/ from images built with the
# real tools (see fuzz/src/seeds/guest.rs):
#   python3 fuzz/seeds-data/guest_image.py MODE IMAGE OUT   (MODE 0 image, 1 tar)
# chunk.py MODE IMAGE OUT: the fuzz input format of guest_image: mode, size
# exponent, then records (u16 len, u32 sector, bytes) of the non-zero sectors.
mode, img, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
data = open(img, 'rb').read()
size = len(data)
exp = max(0, (size - 1).bit_length() - 12)
assert (1 << (12 + exp)) >= size
recs = []
n = size // 512
i = 0
while i < n:
    s = data[i*512:(i+1)*512]
    if s.count(0) == 512:
        i += 1; continue
    j = i
    while j < n and data[j*512:(j+1)*512].count(0) != 512 and (j - i + 1) * 512 + 4 <= 65535:
        j += 1
    recs.append(struct.pack('<I', i) + data[i*512:j*512])
    i = j
buf = bytes([mode, exp]) + b''.join(struct.pack('<H', len(r)) + r for r in recs)
open(out, 'wb').write(buf)
print(out, len(buf), 'bytes', len(recs), 'records')
