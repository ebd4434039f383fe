# AOT ID: ['0_backward']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


cpp_fused__unsafe_view_mul_silu_silu_backward_view_0 = async_compile.cpp_pybinding(['float*', 'const float*', 'const float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(float* in_out_ptr0,
                       const float* in_ptr0,
                       const float* in_ptr1,
                       float* out_ptr0)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(176128L); x0+=static_cast<int64_t>(16L))
        {
            {
                if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(176128L)))
                {
                    auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x0), static_cast<int64_t>(16));
                    auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x0), static_cast<int64_t>(16));
                    auto tmp10 = at::vec::Vectorized<float>::loadu(in_out_ptr0 + static_cast<int64_t>(x0), static_cast<int64_t>(16));
                    auto tmp2 = tmp1.neg();
                    auto tmp3 = tmp2.exp();
                    auto tmp4 = static_cast<float>(1.0);
                    auto tmp5 = at::vec::Vectorized<float>(tmp4);
                    auto tmp6 = tmp3 + tmp5;
                    auto tmp7 = tmp1 / tmp6;
                    auto tmp8 = tmp0 * tmp7;
                    auto tmp9 = decltype(tmp1)(1)/(decltype(tmp1)(1) + tmp1.neg().exp());
                    auto tmp11 = tmp0 * tmp10;
                    auto tmp12 = tmp11 * tmp9;
                    auto tmp13 = tmp5 - tmp9;
                    auto tmp14 = tmp1 * tmp13;
                    auto tmp15 = tmp14 + tmp5;
                    auto tmp16 = tmp12 * tmp15;
                    tmp8.store(out_ptr0 + static_cast<int64_t>(x0));
                    tmp16.store(in_out_ptr0 + static_cast<int64_t>(x0));
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused__unsafe_view_add_div_expand_mul_pow_sum_view_1 = async_compile.cpp_pybinding(['const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       const float* in_ptr2,
                       const float* in_ptr3,
                       const float* in_ptr4,
                       const float* in_ptr5,
                       const float* in_ptr6,
                       float* out_ptr0,
                       float* out_ptr1)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(512L); x0+=static_cast<int64_t>(1L))
        {
            {
                float tmp_acc0 = 0;
                at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(0);
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(128L); x1+=static_cast<int64_t>(16L))
                {
                    {
                        if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(128L)))
                        {
                            auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp3 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x1), static_cast<int64_t>(16));
                            auto tmp5 = at::vec::Vectorized<float>::loadu(in_ptr3 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp6 = at::vec::Vectorized<float>::loadu(in_ptr4 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp2 = tmp0 + tmp1;
                            auto tmp4 = tmp2 * tmp3;
                            auto tmp7 = tmp5 + tmp6;
                            auto tmp8 = tmp4 * tmp7;
                            tmp_acc0_vec = tmp_acc0_vec + tmp8;
                        }
                    }
                }
                tmp_acc0 = tmp_acc0 + at::vec::vec_reduce_all<float, 1>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return x + y; }, tmp_acc0_vec);
                out_ptr0[static_cast<int64_t>(x0)] = static_cast<float>(tmp_acc0);
            }
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(128L); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(128L)))
                    {
                        auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr5 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp2 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp4 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x1), static_cast<int64_t>(16));
                        auto tmp6 = in_ptr6[static_cast<int64_t>(x0)];
                        auto tmp10 = out_ptr0[static_cast<int64_t>(x0)];
                        auto tmp18 = at::vec::Vectorized<float>::loadu(in_ptr3 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp19 = at::vec::Vectorized<float>::loadu(in_ptr4 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp3 = tmp1 + tmp2;
                        auto tmp5 = tmp3 * tmp4;
                        auto tmp7 = at::vec::Vectorized<float>(tmp6);
                        auto tmp8 = tmp5 * tmp7;
                        auto tmp9 = tmp0 + tmp8;
                        auto tmp11 = static_cast<float>(-0.5);
                        auto tmp12 = float(tmp10 * tmp11);
                        auto tmp13 = float(tmp6 * tmp6);
                        auto tmp14 = float(tmp13 * tmp6);
                        auto tmp15 = float(tmp12 * tmp14);
                        auto tmp16 = static_cast<float>(128.0);
                        auto tmp17 = tmp15 / tmp16;
                        auto tmp20 = tmp18 + tmp19;
                        auto tmp21 = static_cast<float>(2.0);
                        auto tmp22 = at::vec::Vectorized<float>(tmp21);
                        auto tmp23 = tmp20 * tmp22;
                        auto tmp24 = at::vec::Vectorized<float>(tmp17);
                        auto tmp25 = tmp24 * tmp23;
                        auto tmp26 = tmp9 + tmp25;
                        tmp26.store(out_ptr1 + static_cast<int64_t>(x1 + 128L*x0));
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_transpose_view_2 = async_compile.cpp_pybinding(['const float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       float* out_ptr0)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(4L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4L); x1+=static_cast<int64_t>(16L))
            {
                for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(128L); x2+=static_cast<int64_t>(16L))
                {
                    {
                        if(C10_LIKELY(x1 >= static_cast<int64_t>(0L) && x1 < static_cast<int64_t>(4L) && x2 >= static_cast<int64_t>(0) && x2 < static_cast<int64_t>(128L)))
                        {
                            alignas(std::max(std::size_t(16), alignof(float))) float tmp0[16*16];
                            transpose_mxn<float,static_cast<int64_t>(16),static_cast<int64_t>(4L),false>(in_ptr0 + static_cast<int64_t>(x1 + 4L*x2 + 512L*x0), static_cast<int64_t>(4L), tmp0, static_cast<int64_t>(16));
                            for (long x1_inner = 0; x1_inner < static_cast<int64_t>(4L); x1_inner++)
                            {
                                auto tmp1 = at::vec::Vectorized<float>::loadu(tmp0 + static_cast<int64_t>(16L*x1_inner), static_cast<int64_t>(16));
                                tmp1.store(out_ptr0 + static_cast<int64_t>(x2 + 128L*x1 + 128L*x1_inner + 512L*x0));
                            }
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused_add_clone_mul_neg_slice_slice_backward_transpose_unsqueeze_3 = async_compile.cpp_pybinding(['const float*', 'const float*', 'const float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       const float* in_ptr2,
                       float* out_ptr0)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(4L); x0+=static_cast<int64_t>(1L))
        {
            #pragma GCC ivdep
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(128L); x1+=static_cast<int64_t>(1L))
            {
                #pragma GCC ivdep
                for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(2L); x2+=static_cast<int64_t>(1L))
                {
                    for(int64_t x3=static_cast<int64_t>(0L); x3<static_cast<int64_t>(32L); x3+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x3 >= static_cast<int64_t>(0) && x3 < static_cast<int64_t>(32L)))
                            {
                                auto tmp27 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x3 + 32L*x2 + 64L*x1 + 8192L*x0), static_cast<int64_t>(16));
                                auto tmp28 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x3 + 32L*x1), static_cast<int64_t>(16));
                                auto tmp0 = x3;
                                auto tmp1 = c10::convert<int64_t>(tmp0);
                                auto tmp2 = at::vec::VectorizedN<int64_t,2>::arange(tmp1, 1);
                                auto tmp3 = static_cast<int64_t>(16);
                                auto tmp4 = at::vec::VectorizedN<int64_t,2>(tmp3);
                                auto tmp5 = at::vec::VecMask<int64_t,2>(tmp2 >= tmp4);
                                auto tmp6 = [&]
                                {
                                    auto tmp7 = tmp5.template cast<float,1>().template loadu<float,1>(in_ptr0 + static_cast<int64_t>((-16L) + x3 + 32L*x2 + 64L*x1 + 8192L*x0));
                                    auto tmp8 = tmp5.template cast<float,1>().template loadu<float,1>(in_ptr1 + static_cast<int64_t>((-16L) + x3 + 32L*x1));
                                    auto tmp9 = tmp7 * tmp8;
                                    auto tmp10 = tmp9.neg();
                                    return tmp10;
                                }
                                ;
                                auto tmp13 =
                                [&]
                                {
                                    if (tmp5.all_zero())
                                    {
                                        return at::vec::Vectorized<float>(static_cast<float>(0.0));
                                    }
                                    else
                                    {
                                        auto tmp11 = tmp6();
                                        auto tmp12 = at::vec::Vectorized<float>(static_cast<float>(0.0));
                                        return decltype(tmp11)::blendv(tmp12, tmp11, tmp5.template cast<float,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp14 = static_cast<float>(0.0);
                                auto tmp15 = at::vec::Vectorized<float>(tmp14);
                                auto tmp16 = decltype(tmp13)::blendv(tmp15, tmp13, tmp5.template cast<float,1>());
                                auto tmp17 = at::vec::VecMask<int64_t,2>(tmp2 < tmp4);
                                auto tmp18 = [&]
                                {
                                    auto tmp19 = tmp17.template cast<float,1>().template loadu<float,1>(in_ptr0 + static_cast<int64_t>(16L + x3 + 32L*x2 + 64L*x1 + 8192L*x0));
                                    auto tmp20 = tmp17.template cast<float,1>().template loadu<float,1>(in_ptr1 + static_cast<int64_t>(16L + x3 + 32L*x1));
                                    auto tmp21 = tmp19 * tmp20;
                                    return tmp21;
                                }
                                ;
                                auto tmp24 =
                                [&]
                                {
                                    if (tmp17.all_zero())
                                    {
                                        return at::vec::Vectorized<float>(static_cast<float>(0.0));
                                    }
                                    else
                                    {
                                        auto tmp22 = tmp18();
                                        auto tmp23 = at::vec::Vectorized<float>(static_cast<float>(0.0));
                                        return decltype(tmp22)::blendv(tmp23, tmp22, tmp17.template cast<float,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp25 = decltype(tmp24)::blendv(tmp15, tmp24, tmp17.template cast<float,1>());
                                auto tmp26 = tmp16 + tmp25;
                                auto tmp29 = tmp27 * tmp28;
                                auto tmp30 = tmp26 + tmp29;
                                tmp30.store(out_ptr0 + static_cast<int64_t>(x3 + 32L*x2 + 64L*x1 + 8192L*x0));
                            }
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused_add_clone_mul_neg_slice_slice_backward_transpose_unsqueeze_4 = async_compile.cpp_pybinding(['const float*', 'const float*', 'const float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       const float* in_ptr2,
                       float* out_ptr0)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(4L); x0+=static_cast<int64_t>(1L))
        {
            #pragma GCC ivdep
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(128L); x1+=static_cast<int64_t>(1L))
            {
                #pragma GCC ivdep
                for(int64_t x2=static_cast<int64_t>(0L); x2<static_cast<int64_t>(4L); x2+=static_cast<int64_t>(1L))
                {
                    for(int64_t x3=static_cast<int64_t>(0L); x3<static_cast<int64_t>(32L); x3+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x3 >= static_cast<int64_t>(0) && x3 < static_cast<int64_t>(32L)))
                            {
                                auto tmp27 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x3 + 32L*x2 + 128L*x1 + 16384L*x0), static_cast<int64_t>(16));
                                auto tmp28 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x3 + 32L*x1), static_cast<int64_t>(16));
                                auto tmp0 = x3;
                                auto tmp1 = c10::convert<int64_t>(tmp0);
                                auto tmp2 = at::vec::VectorizedN<int64_t,2>::arange(tmp1, 1);
                                auto tmp3 = static_cast<int64_t>(16);
                                auto tmp4 = at::vec::VectorizedN<int64_t,2>(tmp3);
                                auto tmp5 = at::vec::VecMask<int64_t,2>(tmp2 >= tmp4);
                                auto tmp6 = [&]
                                {
                                    auto tmp7 = tmp5.template cast<float,1>().template loadu<float,1>(in_ptr0 + static_cast<int64_t>((-16L) + x3 + 32L*x2 + 128L*x1 + 16384L*x0));
                                    auto tmp8 = tmp5.template cast<float,1>().template loadu<float,1>(in_ptr1 + static_cast<int64_t>((-16L) + x3 + 32L*x1));
                                    auto tmp9 = tmp7 * tmp8;
                                    auto tmp10 = tmp9.neg();
                                    return tmp10;
                                }
                                ;
                                auto tmp13 =
                                [&]
                                {
                                    if (tmp5.all_zero())
                                    {
                                        return at::vec::Vectorized<float>(static_cast<float>(0.0));
                                    }
                                    else
                                    {
                                        auto tmp11 = tmp6();
                                        auto tmp12 = at::vec::Vectorized<float>(static_cast<float>(0.0));
                                        return decltype(tmp11)::blendv(tmp12, tmp11, tmp5.template cast<float,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp14 = static_cast<float>(0.0);
                                auto tmp15 = at::vec::Vectorized<float>(tmp14);
                                auto tmp16 = decltype(tmp13)::blendv(tmp15, tmp13, tmp5.template cast<float,1>());
                                auto tmp17 = at::vec::VecMask<int64_t,2>(tmp2 < tmp4);
                                auto tmp18 = [&]
                                {
                                    auto tmp19 = tmp17.template cast<float,1>().template loadu<float,1>(in_ptr0 + static_cast<int64_t>(16L + x3 + 32L*x2 + 128L*x1 + 16384L*x0));
                                    auto tmp20 = tmp17.template cast<float,1>().template loadu<float,1>(in_ptr1 + static_cast<int64_t>(16L + x3 + 32L*x1));
                                    auto tmp21 = tmp19 * tmp20;
                                    return tmp21;
                                }
                                ;
                                auto tmp24 =
                                [&]
                                {
                                    if (tmp17.all_zero())
                                    {
                                        return at::vec::Vectorized<float>(static_cast<float>(0.0));
                                    }
                                    else
                                    {
                                        auto tmp22 = tmp18();
                                        auto tmp23 = at::vec::Vectorized<float>(static_cast<float>(0.0));
                                        return decltype(tmp22)::blendv(tmp23, tmp22, tmp17.template cast<float,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp25 = decltype(tmp24)::blendv(tmp15, tmp24, tmp17.template cast<float,1>());
                                auto tmp26 = tmp16 + tmp25;
                                auto tmp29 = tmp27 * tmp28;
                                auto tmp30 = tmp26 + tmp29;
                                tmp30.store(out_ptr0 + static_cast<int64_t>(x3 + 32L*x2 + 128L*x1 + 16384L*x0));
                            }
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused__unsafe_view_add_mul_sum_view_5 = async_compile.cpp_pybinding(['const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       const float* in_ptr2,
                       const float* in_ptr3,
                       const float* in_ptr4,
                       const float* in_ptr5,
                       const float* in_ptr6,
                       const float* in_ptr7,
                       const float* in_ptr8,
                       float* out_ptr0,
                       float* out_ptr1)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(128L); x0+=static_cast<int64_t>(16L))
        {
            {
                float tmp_acc0 = 0;
                at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(0);
                float tmp_acc1 = 0;
                at::vec::Vectorized<float> tmp_acc1_vec = at::vec::Vectorized<float>(0);
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(512L); x1+=static_cast<int64_t>(1L))
                {
                    {
                        if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(128L)))
                        {
                            auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x0 + 128L*x1), static_cast<int64_t>(16));
                            auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x0 + 128L*x1), static_cast<int64_t>(16));
                            auto tmp3 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x0 + 128L*x1), static_cast<int64_t>(16));
                            auto tmp4 = at::vec::Vectorized<float>::loadu(in_ptr3 + static_cast<int64_t>(x0 + 128L*x1), static_cast<int64_t>(16));
                            auto tmp6 = in_ptr4[static_cast<int64_t>(x1)];
                            auto tmp10 = at::vec::Vectorized<float>::loadu(in_ptr5 + static_cast<int64_t>(x0 + 128L*x1), static_cast<int64_t>(16));
                            auto tmp11 = at::vec::Vectorized<float>::loadu(in_ptr6 + static_cast<int64_t>(x0 + 128L*x1), static_cast<int64_t>(16));
                            auto tmp13 = at::vec::Vectorized<float>::loadu(in_ptr7 + static_cast<int64_t>(x0 + 128L*x1), static_cast<int64_t>(16));
                            auto tmp15 = in_ptr8[static_cast<int64_t>(x1)];
                            auto tmp2 = tmp0 + tmp1;
                            auto tmp5 = tmp3 + tmp4;
                            auto tmp7 = at::vec::Vectorized<float>(tmp6);
                            auto tmp8 = tmp5 * tmp7;
                            auto tmp9 = tmp2 * tmp8;
                            auto tmp12 = tmp10 + tmp11;
                            auto tmp14 = tmp12 + tmp13;
                            auto tmp16 = at::vec::Vectorized<float>(tmp15);
                            auto tmp17 = tmp3 * tmp16;
                            auto tmp18 = tmp14 * tmp17;
                            tmp_acc0_vec = tmp_acc0_vec + tmp9;
                            tmp_acc1_vec = tmp_acc1_vec + tmp18;
                        }
                    }
                }
                if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(128L)))
                {
                    tmp_acc0_vec.store(out_ptr0 + static_cast<int64_t>(x0));
                    tmp_acc1_vec.store(out_ptr1 + static_cast<int64_t>(x0));
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


cpp_fused_add_div_expand_mul_pow_sum_view_6 = async_compile.cpp_pybinding(['float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'const float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(float* in_out_ptr0,
                       const float* in_ptr0,
                       const float* in_ptr1,
                       const float* in_ptr2,
                       const float* in_ptr3,
                       const float* in_ptr4,
                       const float* in_ptr5,
                       float* out_ptr0)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(512L); x0+=static_cast<int64_t>(1L))
        {
            {
                float tmp_acc0 = 0;
                at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(0);
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(128L); x1+=static_cast<int64_t>(16L))
                {
                    {
                        if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(128L)))
                        {
                            auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp3 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp5 = at::vec::Vectorized<float>::loadu(in_ptr3 + static_cast<int64_t>(x1), static_cast<int64_t>(16));
                            auto tmp7 = at::vec::Vectorized<float>::loadu(in_ptr4 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                            auto tmp2 = tmp0 + tmp1;
                            auto tmp4 = tmp2 + tmp3;
                            auto tmp6 = tmp4 * tmp5;
                            auto tmp8 = tmp6 * tmp7;
                            tmp_acc0_vec = tmp_acc0_vec + tmp8;
                        }
                    }
                }
                tmp_acc0 = tmp_acc0 + at::vec::vec_reduce_all<float, 1>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return x + y; }, tmp_acc0_vec);
                out_ptr0[static_cast<int64_t>(x0)] = static_cast<float>(tmp_acc0);
            }
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(128L); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(128L)))
                    {
                        auto tmp0 = at::vec::Vectorized<float>::loadu(in_out_ptr0 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp2 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp4 = at::vec::Vectorized<float>::loadu(in_ptr2 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp6 = at::vec::Vectorized<float>::loadu(in_ptr3 + static_cast<int64_t>(x1), static_cast<int64_t>(16));
                        auto tmp8 = in_ptr5[static_cast<int64_t>(x0)];
                        auto tmp12 = out_ptr0[static_cast<int64_t>(x0)];
                        auto tmp20 = at::vec::Vectorized<float>::loadu(in_ptr4 + static_cast<int64_t>(x1 + 128L*x0), static_cast<int64_t>(16));
                        auto tmp3 = tmp1 + tmp2;
                        auto tmp5 = tmp3 + tmp4;
                        auto tmp7 = tmp5 * tmp6;
                        auto tmp9 = at::vec::Vectorized<float>(tmp8);
                        auto tmp10 = tmp7 * tmp9;
                        auto tmp11 = tmp0 + tmp10;
                        auto tmp13 = static_cast<float>(-0.5);
                        auto tmp14 = float(tmp12 * tmp13);
                        auto tmp15 = float(tmp8 * tmp8);
                        auto tmp16 = float(tmp15 * tmp8);
                        auto tmp17 = float(tmp14 * tmp16);
                        auto tmp18 = static_cast<float>(128.0);
                        auto tmp19 = tmp17 / tmp18;
                        auto tmp21 = static_cast<float>(2.0);
                        auto tmp22 = at::vec::Vectorized<float>(tmp21);
                        auto tmp23 = tmp20 * tmp22;
                        auto tmp24 = at::vec::Vectorized<float>(tmp19);
                        auto tmp25 = tmp24 * tmp23;
                        auto tmp26 = tmp11 + tmp25;
                        tmp26.store(in_out_ptr0 + static_cast<int64_t>(x1 + 128L*x0));
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, rsqrt, view, permute_5, add_1, add_2, getitem, getitem_1, mm_3, rsqrt_1, view_13, mm_4, mm_5, view_17, tangents_1 = args
        args.clear()
        assert_size_stride(tangents_1, (4, 128, 128), (16384, 128, 1), 'input')
        assert_size_stride(view_17, (512, 344), (344, 1), 'input')
        buf0 = empty_strided_cpu((128, 344), (344, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_19, permute_11, mm_7], Original ATen: [aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(tangents_1, (128, 512), (1, 128), 0), view_17, out=buf0)
        del view_17
        assert_size_stride(primals_12, (128, 344), (344, 1), 'input')
        buf1 = empty_strided_cpu((512, 344), (344, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_19, down_proj, permute_13, mm_8], Original ATen: [aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(tangents_1, (512, 128), (128, 1), 0), primals_12, out=buf1)
        del primals_12
        assert_size_stride(mm_4, (512, 344), (344, 1), 'input')
        assert_size_stride(mm_5, (512, 344), (344, 1), 'input')
        buf2 = empty_strided_cpu((4, 128, 344), (44032, 344, 1), torch.float32)
        buf6 = reinterpret_tensor(mm_5, (4, 128, 344), (44032, 344, 1), 0); del mm_5  # reuse
        assert_size_stride(view_13, (512, 128), (128, 1), 'input')
        cpp_fused__unsafe_view_mul_silu_silu_backward_view_0(buf6, buf1, mm_4, buf2)
        del buf1
        del mm_4
        buf3 = empty_strided_cpu((344, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_20, linear_4, silu, mul_9, view_21, permute_15, mm_9], Original ATen: [aten.view, aten._unsafe_view, aten.silu, aten.mul, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf2, (344, 512), (1, 344), 0), view_13, out=buf3)
        assert_size_stride(primals_11, (344, 128), (128, 1), 'input')
        buf4 = empty_strided_cpu((512, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_20, linear_4, silu, mul_9, view_21, linear_5, permute_17, mm_10], Original ATen: [aten.view, aten._unsafe_view, aten.silu, aten.mul, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf2, (512, 344), (344, 1), 0), primals_11, out=buf4)
        del buf2
        del primals_11
        buf7 = empty_strided_cpu((344, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_20, linear_4, linear_5, mul_10, mul_11, sub, mul_12, add_7, mul_13, view_23, permute_19, mm_11], Original ATen: [aten.view, aten._unsafe_view, aten.mul, aten.silu_backward, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf6, (344, 512), (1, 344), 0), view_13, out=buf7)
        del view_13
        assert_size_stride(primals_10, (344, 128), (128, 1), 'input')
        buf8 = empty_strided_cpu((512, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_20, linear_4, linear_5, mul_10, mul_11, sub, mul_12, add_7, mul_13, view_23, permute_21, mm_12], Original ATen: [aten.view, aten._unsafe_view, aten.mul, aten.silu_backward, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf6, (512, 344), (344, 1), 0), primals_10, out=buf8)
        del buf6
        del primals_10
        assert_size_stride(primals_9, (128, ), (1, ), 'input')
        assert_size_stride(primals_1, (4, 128, 128), (16384, 128, 1), 'input')
        assert_size_stride(mm_3, (512, 128), (128, 1), 'input')
        assert_size_stride(rsqrt_1, (4, 128, 1), (128, 1, 1), 'input')
        buf10 = empty_strided_cpu((4, 128, 1), (128, 1, 512), torch.float32)
        buf11 = empty_strided_cpu((4, 128, 128), (16384, 128, 1), torch.float32)
        assert_size_stride(primals_8, (128, 128), (128, 1), 'input')
        cpp_fused__unsafe_view_add_div_expand_mul_pow_sum_view_1(buf4, buf8, primals_9, primals_1, mm_3, tangents_1, rsqrt_1, buf10, buf11)
        del primals_9
        del tangents_1
        buf13 = empty_strided_cpu((512, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_26, attn_output_4, permute_25, mm_14], Original ATen: [aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf11, (512, 128), (128, 1), 0), primals_8, out=buf13)
        del primals_8
        assert_size_stride(getitem_1, (4, 4, 128), (512, 1, 4), 'input')
        buf14 = empty_strided_cpu((4, 4, 128), (512, 128, 1), torch.float32)
        assert_size_stride(add_1, (4, 4, 128, 32), (16384, 32, 128, 1), 'input')
        assert_size_stride(add_2, (4, 2, 128, 32), (8192, 32, 64, 1), 'input')
        assert_size_stride(permute_5, (4, 2, 128, 32), (8192, 32, 64, 1), 'input')
        assert_size_stride(getitem, (4, 4, 128, 32), (16384, 32, 128, 1), 'input')
        cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_transpose_view_2(getitem_1, buf14)
        del getitem_1
        # Topologically Sorted Source Nodes: [view_27, view_28, permute_27, _scaled_dot_product_flash_attention_for_cpu_backward], Original ATen: [aten.view, aten.transpose, aten._scaled_dot_product_flash_attention_for_cpu_backward]
        buf15 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(reinterpret_tensor(buf13, (4, 4, 128, 32), (16384, 32, 128, 1), 0), add_1, add_2, permute_5, getitem, buf14, 0.0, True, scale=0.1767766952966369)
        del add_1
        del add_2
        del buf14
        del permute_5
        buf18 = buf15[2]
        assert_size_stride(buf18, (4, 2, 128, 32), (8192, 32, 64, 1), 'torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default')
        # buffer buf18 (op: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default) is assumed to be not aligned
        assert_size_stride(primals_5, (64, 128), (128, 1), 'input')
        buf20 = buf13; del buf13  # reuse
        # Topologically Sorted Source Nodes: [permute_28, view_30, view_31, linear_2, permute_31, mm_16], Original ATen: [aten.transpose, aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf18, (512, 64), (64, 1), 0), primals_5, out=buf20)
        del primals_5
        buf17 = buf15[1]
        assert_size_stride(buf17, (4, 2, 128, 32), (8192, 32, 64, 1), 'torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default')
        # buffer buf17 (op: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default) is assumed to be not aligned
        assert_size_stride(primals_7, (1, 128, 32), (4096, 32, 1), 'input')
        assert_size_stride(primals_6, (1, 128, 32), (4096, 32, 1), 'input')
        buf21 = empty_strided_cpu((4, 128, 2, 32), (8192, 64, 32, 1), torch.float32)
        assert_size_stride(primals_4, (64, 128), (128, 1), 'input')
        cpp_fused_add_clone_mul_neg_slice_slice_backward_transpose_unsqueeze_3(buf17, primals_7, primals_6, buf21)
        del buf17
        buf23 = empty_strided_cpu((512, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [sin, mul_22, slice_5, slice_6, neg_3, full_default, add_11, cos, mul_23, add_12, permute_33, clone, view_33, view_34, linear_1, permute_36, mm_18], Original ATen: [aten.unsqueeze, aten.mul, aten.slice, aten.neg, aten.slice_backward, aten.add, aten.transpose, aten.clone, aten._unsafe_view, aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf21, (512, 64), (64, 1), 0), primals_4, out=buf23)
        del primals_4
        buf16 = buf15[0]
        assert_size_stride(buf16, (4, 4, 128, 32), (16384, 32, 128, 1), 'torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default')
        # buffer buf16 (op: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default) is assumed to be not aligned
        del buf15
        buf24 = empty_strided_cpu((4, 128, 4, 32), (16384, 128, 32, 1), torch.float32)
        assert_size_stride(primals_3, (128, 128), (128, 1), 'input')
        cpp_fused_add_clone_mul_neg_slice_slice_backward_transpose_unsqueeze_4(buf16, primals_7, primals_6, buf24)
        del buf16
        del primals_6
        del primals_7
        buf26 = empty_strided_cpu((512, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [sin, cos, mul_24, slice_7, slice_8, neg_4, full_default_2, add_13, mul_25, add_14, permute_38, clone_1, view_36, view_37, linear, permute_41, mm_20], Original ATen: [aten.unsqueeze, aten.mul, aten.slice, aten.neg, aten.slice_backward, aten.add, aten.transpose, aten.clone, aten._unsafe_view, aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf24, (512, 128), (128, 1), 0), primals_3, out=buf26)
        del primals_3
        assert_size_stride(rsqrt, (4, 128, 1), (128, 1, 1), 'input')
        buf9 = empty_strided_cpu((1, 1, 128), (128, 128, 1), torch.float32)
        buf27 = empty_strided_cpu((1, 1, 128), (128, 128, 1), torch.float32)
        cpp_fused__unsafe_view_add_mul_sum_view_5(buf4, buf8, primals_1, mm_3, rsqrt_1, buf20, buf23, buf26, rsqrt, buf9, buf27)
        del buf4
        del buf8
        del mm_3
        del rsqrt_1
        buf12 = empty_strided_cpu((128, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [view_26, permute_23, transpose_3, reshape_1, attn_output_4, mm_13], Original ATen: [aten.view, aten.t, aten.transpose, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf11, (128, 512), (1, 128), 0), reinterpret_tensor(getitem, (512, 128), (128, 1), 0), out=buf12)
        del getitem
        assert_size_stride(view, (512, 128), (128, 1), 'input')
        buf19 = empty_strided_cpu((64, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [permute_28, view_30, view_31, permute_29, mm_15], Original ATen: [aten.transpose, aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf18, (64, 512), (1, 64), 0), view, out=buf19)
        del buf18
        buf22 = empty_strided_cpu((64, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [sin, mul_22, slice_5, slice_6, neg_3, full_default, add_11, cos, mul_23, add_12, permute_33, clone, view_33, view_34, permute_34, mm_17], Original ATen: [aten.unsqueeze, aten.mul, aten.slice, aten.neg, aten.slice_backward, aten.add, aten.transpose, aten.clone, aten._unsafe_view, aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf21, (64, 512), (1, 64), 0), view, out=buf22)
        del buf21
        buf25 = empty_strided_cpu((128, 128), (128, 1), torch.float32)
        # Topologically Sorted Source Nodes: [sin, cos, mul_24, slice_7, slice_8, neg_4, full_default_2, add_13, mul_25, add_14, permute_38, clone_1, view_36, view_37, permute_39, mm_19], Original ATen: [aten.unsqueeze, aten.mul, aten.slice, aten.neg, aten.slice_backward, aten.add, aten.transpose, aten.clone, aten._unsafe_view, aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(buf24, (128, 512), (1, 128), 0), view, out=buf25)
        del buf24
        del view
        assert_size_stride(primals_2, (128, ), (1, ), 'input')
        buf28 = buf10; del buf10  # reuse
        buf29 = buf11; del buf11  # reuse
        cpp_fused_add_div_expand_mul_pow_sum_view_6(buf29, buf20, buf23, buf26, primals_2, primals_1, rsqrt, buf28)
        del buf20
        del buf23
        del buf26
        del buf28
        del primals_1
        del primals_2
        del rsqrt
        return (buf29, reinterpret_tensor(buf27, (128, ), (1, ), 0), buf25, buf22, buf19, None, None, buf12, reinterpret_tensor(buf9, (128, ), (1, ), 0), buf7, buf3, buf0, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    primals_1 = rand_strided((4, 128, 128), (16384, 128, 1), device='cpu', dtype=torch.float32)
    primals_2 = rand_strided((128, ), (1, ), device='cpu', dtype=torch.float32)
    primals_3 = rand_strided((128, 128), (128, 1), device='cpu', dtype=torch.float32)
    primals_4 = rand_strided((64, 128), (128, 1), device='cpu', dtype=torch.float32)
    primals_5 = rand_strided((64, 128), (128, 1), device='cpu', dtype=torch.float32)
    primals_6 = rand_strided((1, 128, 32), (4096, 32, 1), device='cpu', dtype=torch.float32)
    primals_7 = rand_strided((1, 128, 32), (4096, 32, 1), device='cpu', dtype=torch.float32)
    primals_8 = rand_strided((128, 128), (128, 1), device='cpu', dtype=torch.float32)
    primals_9 = rand_strided((128, ), (1, ), device='cpu', dtype=torch.float32)
    primals_10 = rand_strided((344, 128), (128, 1), device='cpu', dtype=torch.float32)
    primals_11 = rand_strided((344, 128), (128, 1), device='cpu', dtype=torch.float32)
    primals_12 = rand_strided((128, 344), (344, 1), device='cpu', dtype=torch.float32)
    rsqrt = rand_strided((4, 128, 1), (128, 1, 1), device='cpu', dtype=torch.float32)
    view = rand_strided((512, 128), (128, 1), device='cpu', dtype=torch.float32)
    permute_5 = rand_strided((4, 2, 128, 32), (8192, 32, 64, 1), device='cpu', dtype=torch.float32)
    add_1 = rand_strided((4, 4, 128, 32), (16384, 32, 128, 1), device='cpu', dtype=torch.float32)
    add_2 = rand_strided((4, 2, 128, 32), (8192, 32, 64, 1), device='cpu', dtype=torch.float32)
    getitem = rand_strided((4, 4, 128, 32), (16384, 32, 128, 1), device='cpu', dtype=torch.float32)
    getitem_1 = rand_strided((4, 4, 128), (512, 1, 4), device='cpu', dtype=torch.float32)
    mm_3 = rand_strided((512, 128), (128, 1), device='cpu', dtype=torch.float32)
    rsqrt_1 = rand_strided((4, 128, 1), (128, 1, 1), device='cpu', dtype=torch.float32)
    view_13 = rand_strided((512, 128), (128, 1), device='cpu', dtype=torch.float32)
    mm_4 = rand_strided((512, 344), (344, 1), device='cpu', dtype=torch.float32)
    mm_5 = rand_strided((512, 344), (344, 1), device='cpu', dtype=torch.float32)
    view_17 = rand_strided((512, 344), (344, 1), device='cpu', dtype=torch.float32)
    tangents_1 = rand_strided((4, 128, 128), (16384, 128, 1), device='cpu', dtype=torch.float32)
    return [primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, rsqrt, view, permute_5, add_1, add_2, getitem, getitem_1, mm_3, rsqrt_1, view_13, mm_4, mm_5, view_17, tangents_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat, device='cpu')


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))
