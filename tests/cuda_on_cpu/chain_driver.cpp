// Runs spectest/gpu/cuda/chain.cu's kernel on the CPU (cuda_on_cpu.h) over inputs from files: the launch
// reference-cupy makes, with every pointer, offset and stride as the host wrapper passes them.
//
//   chain_driver DTYPE BUG B K V FOLDER  Q_OFFSET Q_ROW Q_POS  P_OFFSET P_ROW P_POS  D_OFFSET D_ROW D_POS
//   chain_driver fp16-table FILE   (every fp16 bit pattern widened by the kernel's conversion, float32)
//
// FOLDER holds drafts.bin (int64 storage), q.bin and p.bin (the storages, raw DTYPE values), u.bin (float32, or
// float64 for float64), v.bin (float64); the kernel's output, int64 [B, K + 1], is written to FOLDER/out.bin.
// Every buffer is allocated at exactly its size, 16-byte aligned, so that AddressSanitizer sees a read one
// element past it and an offset decides whether the rows are aligned for vector loads.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_on_cpu.h"
#include "chain.cu"

namespace {

struct Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
};

Buffer read_file(const std::string& path) {
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) {
        std::fprintf(stderr, "cannot open %s\n", path.c_str());
        std::exit(2);
    }
    std::fseek(file, 0, SEEK_END);
    Buffer buffer;
    buffer.bytes = static_cast<std::size_t>(std::ftell(file));
    std::fseek(file, 0, SEEK_SET);
    // Exactly the file's bytes (aligned_alloc wants a multiple of the alignment: malloc's 16 bytes suffice).
    buffer.data = std::malloc(buffer.bytes == 0 ? 1 : buffer.bytes);
    if (reinterpret_cast<std::uintptr_t>(buffer.data) % 16 != 0) std::abort();
    if (std::fread(buffer.data, 1, buffer.bytes, file) != buffer.bytes) std::exit(2);
    std::fclose(file);
    return buffer;
}

struct Launch {
    int bug, k;
    long long batch, vocab, q_offset, q_row, q_pos, p_offset, p_row, p_pos, d_offset, d_row, d_pos;
    std::string folder;
};

template <typename T, int BUG>
void run(const Launch& launch) {
    typedef typename SpectestElement<T>::uniform uniform;
    Buffer drafts = read_file(launch.folder + "/drafts.bin"), q = read_file(launch.folder + "/q.bin");
    Buffer p = read_file(launch.folder + "/p.bin"), u = read_file(launch.folder + "/u.bin");
    Buffer v = read_file(launch.folder + "/v.bin");
    const std::size_t out_bytes = static_cast<std::size_t>(launch.batch) * (launch.k + 1) * sizeof(long long);
    long long* out = static_cast<long long*>(std::malloc(out_bytes == 0 ? 1 : out_bytes));
    for (std::size_t i = 0; i < out_bytes / sizeof(long long); ++i) out[i] = 7777777;  // never a kernel's value
    cuda_on_cpu::launch(static_cast<unsigned int>(launch.batch), SPECTEST_THREADS, spectest_chain<T, BUG>,
                        static_cast<const long long*>(drafts.data) + launch.d_offset, launch.d_row, launch.d_pos,
                        static_cast<const T*>(q.data) + launch.q_offset, launch.q_row, launch.q_pos,
                        static_cast<const T*>(p.data) + launch.p_offset, launch.p_row, launch.p_pos,
                        static_cast<const uniform*>(u.data), static_cast<const double*>(v.data), out, launch.k,
                        launch.vocab);
    std::FILE* file = std::fopen((launch.folder + "/out.bin").c_str(), "wb");
    std::fwrite(out, 1, out_bytes, file);
    std::fclose(file);
    for (Buffer* buffer : {&drafts, &q, &p, &u, &v}) std::free(buffer->data);
    std::free(out);
}

template <typename T>
void run_variant(const Launch& launch) {
    switch (launch.bug) {
        case 0: return run<T, 0>(launch);
        case 1: return run<T, 1>(launch);
        case 2: return run<T, 2>(launch);
        case 3: return run<T, 3>(launch);
        default: std::exit(2);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "fp16-table") {
        std::FILE* file = std::fopen(argv[2], "wb");
        for (unsigned int h = 0; h < 65536; ++h) {
            const float f = spectest_fp16_to_float(static_cast<unsigned short>(h));
            std::fwrite(&f, 4, 1, file);
        }
        std::fclose(file);
        return 0;
    }
    if (argc != 16) {
        std::fprintf(stderr, "usage: %s DTYPE BUG B K V FOLDER Q_OFFSET Q_ROW Q_POS P_OFFSET P_ROW P_POS D_OFFSET D_ROW D_POS\n",
                     argv[0]);
        return 2;
    }
    const std::string dtype = argv[1];
    Launch launch;
    launch.bug = std::atoi(argv[2]);
    launch.batch = std::atoll(argv[3]);
    launch.k = std::atoi(argv[4]);
    launch.vocab = std::atoll(argv[5]);
    launch.folder = argv[6];
    launch.q_offset = std::atoll(argv[7]);
    launch.q_row = std::atoll(argv[8]);
    launch.q_pos = std::atoll(argv[9]);
    launch.p_offset = std::atoll(argv[10]);
    launch.p_row = std::atoll(argv[11]);
    launch.p_pos = std::atoll(argv[12]);
    launch.d_offset = std::atoll(argv[13]);
    launch.d_row = std::atoll(argv[14]);
    launch.d_pos = std::atoll(argv[15]);
    if (dtype == "float32") run_variant<float>(launch);
    else if (dtype == "float64") run_variant<double>(launch);
    else if (dtype == "bfloat16") run_variant<spectest_bf16>(launch);
    else if (dtype == "float16") run_variant<spectest_fp16>(launch);
    else return 2;
    return 0;
}
